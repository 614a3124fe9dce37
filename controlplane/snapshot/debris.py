"""The debris rule: which names in a model directory are editor and tool leftovers, never content.

One rule for every consumer: the capture leaves debris out, the watchers never start a settle window
for it, the poller and the fleet leader skip it when listing models, the S3 source drops such keys.
"""

from __future__ import annotations


def is_ignored_name(name: str) -> bool:
    """Editor and tool debris that never belongs to a model: dotfiles (.git, .x.swp, .#x, rsync temps,
    the hold file), backups (x~), temp files (x.tmp) and __pycache__."""
    return name.startswith(".") or name.endswith("~") or name.endswith(".tmp") or name == "__pycache__"
