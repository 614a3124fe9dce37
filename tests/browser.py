"""A real headless browser for the web view's tests: Debian's chromium driven over WebDriver (selenium).

Started as TRITON_NOTES.md "A real browser here" measured: headless, as root with --no-sandbox, a fresh
profile in a temp dir, nothing fetched from the network. `console_errors` reads the browser's console
log (SEVERE entries); `screenshot` saves a PNG under results/web/ (what docs/web.md shows).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "web"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900")


def available() -> str | None:
    """Why no browser can run here (None: it can)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        return f"{', '.join(missing)} missing: .ci/install-test-deps installs chromium and chromium-driver"
    return None


def start(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def console_errors(driver: Any) -> list[str]:
    """The console's SEVERE entries since the last call (reading the log empties it)."""
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver: Any, name: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def text(driver: Any, selector: str) -> str:
    """The text of the first element matching `selector` ("" when none): read in the page, so a live
    update that replaced the element between two WebDriver calls cannot make it stale."""
    return str(driver.execute_script(
        "var e = document.querySelector(arguments[0]); return e ? e.textContent.trim() : '';", selector))
