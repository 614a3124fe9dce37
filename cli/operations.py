"""Commands that act through the running daemon: load, unload, rollback, status, policy, pin, gc."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import click

from cli import render
from cli.options import daemon_options, host_option, json_option, reader_options
from controlplane.base.bounds import MAX_COUNT, MAX_DURATION_S, MAX_LIMIT, check_duration
from controlplane.errors import DeployError, TritonctlError, TritonUnavailableError, UsageError
from controlplane.settings.canarysteps import parse_steps
from controlplane.text import clean, duration_s

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient

OUTCOMES_THAT_FAIL = ("failed", "rolled_back")


def _finish(result: dict[str, Any], as_json: bool) -> None:
    """Print the outcome; exit 1 when the operation failed or was rolled back."""
    render.outcome(result, as_json)
    if result.get("outcome") in OUTCOMES_THAT_FAIL:
        if result.get("cause") == "triton_unreachable":  # docs/cli.md "Exit codes": 4
            raise TritonUnavailableError(str(result.get("message", "")))
        raise DeployError(str(result.get("message", "")), str(result.get("outcome")), str(result.get("cause") or ""))


def failed_models(status: dict[str, Any]) -> list[str]:
    """Models whose last deploy failed: nothing or a degraded version serves, a retry is scheduled, or the
    source's newest content is held by a failed deploy."""
    return [
        row["model"] for row in status.get("models", [])
        if row.get("state") in ("failed", "degraded") or row.get("next_retry_s") is not None
        or str(row.get("sync_reason") or "").startswith("last deploy failed")
    ]


@click.command()
@click.argument("models", nargs=-1, metavar="[MODEL]...")
@click.option("--digest", default="", help="Deploy this recorded snapshot (full digest or unique prefix).")
@click.option("--tag", "tag", default="", metavar="NAME", help="Deploy what tag NAME points to (`tritonctl tags`).")
@click.option("--force", is_flag=True, help="Retry a quarantined digest, or reload the active one.")
@click.option("--failed", "failed", is_flag=True, help="Retry every model whose last deploy failed.")
@click.option("--no-wait", is_flag=True, help="Return once the daemon accepted the request.")
@click.option("--bake", "bake", metavar="DURATION", default=None,
              help="Bake this deploy this long on live traffic (5m; 0: no bake) [the daemon's bake_s].")
@click.option("--steps", "steps", metavar="STEPS", default=None,
              help="Through the gateway, this deploy's canary steps: percents of the requests rising to 100, "
                   "`pause` waits for `tritonctl promote` (e.g. '[5, 25, 100]' or 10,pause,100) [canary_steps].")
@click.option("--shadow", "shadow", metavar="DURATION", default=None,
              help="Through the gateway, before its first canary step, judge this deploy this long on a copy of "
                   "live requests whose answers no client gets (5m; 0: no shadow) [shadow_s].")
@host_option
@json_option
@daemon_options
def load(client: ControlClient, models: tuple[str, ...], digest: str, tag: str, force: bool, failed: bool,
         no_wait: bool, bake: str | None, steps: str | None, shadow: str | None, host: str, as_json: bool) -> None:
    """Deploy MODEL's current source content (or a recorded snapshot) and show each step.

    Several MODELs (an ensemble and its steps) deploy as one change set: the old pipeline answers
    until the new one does, and any failure rolls the whole set back.

    \b
    Examples:
      tritonctl load linear
      tritonctl load linear --digest 3f2a9c1b
      tritonctl load linear --tag stable
      tritonctl load linear --force      # retry a quarantined digest
      tritonctl load linear --bake 5m    # serve it 5 minutes on live traffic; roll back if it fails
      tritonctl load linear --steps 5,pause,100 --bake 10m  # 5 % for 10 minutes, then `tritonctl promote`
      tritonctl load linear --shadow 5m  # copies of live requests compared for 5 minutes before any client
      tritonctl load --failed            # retry every model whose last deploy failed
    """
    model = models[0] if models else None
    bake_s = _bake_seconds(bake)
    canary = _steps(steps)
    shadow_s = _bake_seconds(shadow, "--shadow", "no shadow")
    if len(models) > 1:
        if digest or tag or host or failed or bake_s is not None or canary is not None or shadow_s is not None:
            raise UsageError("--digest, --tag, --host, --failed, --bake, --steps and --shadow take one MODEL, not a "
                             "change set of several")
        with render.progress_display(as_json) as show:
            result = client.load(models[0], "", force, wait=not no_wait, on_progress=show, models=list(models))
        _finish(result, as_json)
        return
    if failed:
        if model or digest or tag:
            raise UsageError("--failed takes no MODEL, --digest or --tag: it retries every model whose last deploy "
                             "failed")
        _load_failed(client, force, as_json)
        return
    if not model:
        raise UsageError("load needs MODEL (or --failed); `tritonctl status` lists the models")
    if digest and tag:
        raise UsageError("give --digest or --tag, not both")
    with render.progress_display(as_json) as show:
        result = client.load(model, digest, force, wait=not no_wait, on_progress=show, host=host, tag=tag,
                             bake_s=bake_s, steps=canary, shadow_s=shadow_s)
    _finish(result, as_json)
    if bake_s and not as_json and not no_wait:
        _say_bake(client, model, result)


def _say_bake(client: ControlClient, model: str, result: dict[str, Any]) -> None:
    """`load --bake`: the bake its deploy began (its end and time left), or, on content that already served
    (`noop`: nothing was deployed, so nothing bakes), why there is none."""
    if result.get("outcome") == "noop":
        click.echo(f"no bake: {model} already serves this content, so nothing was deployed to bake; "
                   f"`tritonctl load {model} --force --bake ...` loads it again and bakes it")
        return
    if result.get("outcome") != "ok":
        return
    try:
        rows = client.status([model]).get("models") or []
    except TritonctlError:
        return
    bake = rows[0].get("bake") if rows else None
    if isinstance(bake, dict) and bake.get("digest") == result.get("digest") and bake.get("state") == "baking":
        click.echo(clean(render.bake_line(model, bake)))
    elif isinstance(bake, dict) and bake.get("digest") == result.get("digest") and bake.get("state"):
        click.echo(clean(f"bake: {model} {str(bake.get('digest'))[:12]} {bake['state']}: {bake.get('reason', '')}"))
    else:
        click.echo(f"no bake: {model}'s deploy began none (a fleet's rollouts bake by waves: docs/bake.md)")


def _bake_seconds(text: str | None, flag: str = "--bake", zero: str = "no bake") -> float | None:
    if text is None:
        return None
    seconds = duration_s(text)
    if seconds is None:
        raise UsageError(f"{flag}: '{text}' is not a duration like 30s, 5m, 1h (0: {zero})")
    try:
        return check_duration(seconds)
    except ValueError as exc:
        raise UsageError(f"{flag}: '{text}': {exc}") from None


def _steps(text: str | None) -> list[int | str] | None:
    if text is None:
        return None
    try:
        return list(parse_steps(text))
    except ValueError as exc:
        raise UsageError(f"--steps: '{text}': {exc}") from None


@click.command()
@click.argument("model")
@daemon_options
def promote(client: ControlClient, model: str) -> None:
    """End MODEL's bake in progress as passed: the new version stays (docs/bake.md).

    Through the gateway, a canary goes on to its next step (a `pause` step's only way on); past its
    last step, its bake ends passed.

    \b
    Examples:
      tritonctl promote linear
    """
    bake = client.promote(model)
    canary = bake.get("canary")
    if bake.get("state") == "baking" and canary:
        click.echo(clean(f"{model}: canary of {str(bake.get('digest') or '')[:12]}: {render.canary_text(canary)}"))
        return
    click.echo(clean(f"{model}: bake of {str(bake.get('digest') or '')[:12]} passed: {bake.get('reason', '')}"))


@click.command()
@click.argument("model")
@daemon_options
def abort(client: ControlClient, model: str) -> None:
    """End MODEL's canary (or bake) in progress: every request back on the previous version at once,
    the deploy rolled back (cause analysis), by you (docs/bake.md).

    \b
    Examples:
      tritonctl abort linear
    """
    bake = client.abort(model)
    click.echo(clean(f"{model}: {str(bake.get('digest') or '')[:12]} rolled back: {bake.get('reason', '')}"))


def _load_failed(client: ControlClient, force: bool, as_json: bool) -> None:
    models = failed_models(client.status())
    results = []
    with render.progress_display(as_json) as show:
        for name in models:
            result = client.load(name, "", force, wait=True, on_progress=show)
            results.append(result)
            if not as_json:
                render.outcome(result, False)
    if as_json:
        render.outcome(results, True)  # type: ignore[arg-type]
    elif not models:
        click.echo("no model's last deploy failed")
    bad = [r for r in results if r.get("outcome") in OUTCOMES_THAT_FAIL]
    if bad:
        raise DeployError(f"{len(bad)} of {len(results)} retried model(s) still fail: "
                          + ", ".join(str(r.get("model")) for r in bad), "failed")


@click.command()
@click.argument("model")
@click.option("--dependents", is_flag=True, help="Also unload the ensemble's members no other loaded ensemble uses.")
@click.option("--force", is_flag=True, help="Unload a member that a serving ensemble needs.")
@host_option
@json_option
@daemon_options
def unload(client: ControlClient, model: str, dependents: bool, force: bool, host: str, as_json: bool) -> None:
    """Unload MODEL from Triton; it stays unloaded until `tritonctl load`.

    A member that a serving ensemble needs is refused (exit 2) without --force.

    \b
    Examples:
      tritonctl unload sentiment_pipeline --dependents
      tritonctl unload sentiment_tokenizer --force
    """
    with render.progress_display(as_json) as show:
        result = client.unload(model, dependents, on_progress=show, force=force, host=host)
    _finish(result, as_json)


@click.command()
@click.argument("model")
@click.option("--to", "to_digest", default="", help="Digest to return to (default: the previous good one).")
@click.option("--to-tag", "to_tag", default="", metavar="NAME", help="Return to what tag NAME points to.")
@click.option("--force", is_flag=True, help="Roll back a pinned model anyway.")
@host_option
@json_option
@daemon_options
def rollback(client: ControlClient, model: str, to_digest: str, to_tag: str, force: bool, host: str,
             as_json: bool) -> None:
    """Serve MODEL's previous good version again (or the one given by --to).

    The model then stays there (sync `held`) until its source changes again or `tritonctl load`.

    \b
    Examples:
      tritonctl rollback linear
      tritonctl rollback linear --to 3f2a9c1b
      tritonctl rollback linear --to-tag stable
    """
    if to_digest and to_tag:
        raise UsageError("give --to or --to-tag, not both")
    with render.progress_display(as_json) as show:
        result = client.rollback(model, to_digest, on_progress=show, force=force, host=host, to_tag=to_tag)
    _finish(result, as_json)


@click.command()
@click.argument("models", nargs=-1)
@click.option("--watch", is_flag=True, help="Redraw on every change the daemon reports (its event stream), and "
              "every --interval seconds (Ctrl-C to stop); off a terminal, print one table (with --json one JSON "
              "line) each time.")
@click.option("--interval", type=click.FloatRange(min=0.2, max=MAX_DURATION_S), default=2.0, show_default=True)
@click.option("-o", "--output", type=click.Choice(["wide"]), help="wide: also since, policy, pin, drift, the "
              "source's digest, why it is (not) in sync, the last error.")
@click.option("--fleet", is_flag=True, help="The fleet's model x host matrix (digest, state, drift): the daemon's "
              "(a fleet member's), or with --db-url that registry's.")
@json_option
@reader_options(with_client=True)
def status(reader: Any, client: ControlClient, models: tuple[str, ...], watch: bool, interval: float,
           output: str | None, fleet: bool, as_json: bool) -> None:
    """Show each model: state, whether it serves the source's newest content (sync), digest, versions, age.

    SYNC is synced, pending (settling, capturing, deploying or retrying), held (manual policy, pinned,
    unloaded or rolled back), invalid (the source's newest content is invalid or quarantined) or removed.

    \b
    Examples:
      tritonctl status
      tritonctl status -o wide
      tritonctl status linear sentiment --json
      tritonctl status --watch
      tritonctl status --fleet
      tritonctl status --fleet --db-url postgresql+psycopg://tritonctl@db/tritonctl
    """
    wide = output == "wide"
    if fleet:
        render.fleet_matrix(reader.fleet_matrix(list(models)), as_json)
        return
    if not watch:
        render.status(client.status(list(models)), as_json, wide)
        return
    from cli.follow import change_signal

    changed = change_signal(client)  # the daemon's event stream: redraw on each change, else every interval

    def next_change() -> None:
        changed.wait(interval)
        changed.clear()

    try:
        if as_json or not render.status_is_live():
            while True:  # a pipe or a file: one block (or one JSON line) per change or interval
                data = client.status(list(models))
                if as_json:
                    render.status_line_json(data)
                else:
                    render.status(data, False, wide)
                    click.echo()
                sys.stdout.flush()
                next_change()
        with render.live_status(wide) as update:
            while True:
                update(client.status(list(models)))
                next_change()
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("model")
@click.argument("policy", metavar="{auto|manual|ondemand|inherit|track:TAG}")
@host_option
@json_option
@daemon_options
def policy(client: ControlClient, model: str, policy: str, host: str, as_json: bool) -> None:
    """Set MODEL's deploy policy: auto (every settled valid change deploys), manual, ondemand (loaded by
    `ensure`, unloaded when idle), inherit the global one, or track:TAG (serve whatever tag TAG points to;
    moving the tag deploys).

    \b
    Examples:
      tritonctl policy linear manual
      tritonctl policy linear track:stable
    """
    if policy not in ("auto", "manual", "ondemand", "inherit") and not policy.startswith("track:"):
        raise UsageError(f"policy '{policy}': expected auto, manual, ondemand, inherit or track:TAG")
    if host and policy.startswith("track:"):  # refused before asking the daemon (which refuses it too)
        from controlplane.intake.tags import refuse_host

        refuse_host(policy, host)
    render.policy(client.set_policy(model, policy, host), as_json)


def _pin_command(name: str, pinned: bool, doc: str) -> click.Command:
    """`pin` and `unpin`: the same request, the flag set or cleared."""

    @host_option
    @json_option
    @daemon_options
    def command(client: ControlClient, model: str, host: str, as_json: bool) -> None:
        render.pin(client.set_pin(model, pinned, host), as_json)

    command.__doc__ = doc
    return click.command(name)(click.argument("model")(command))


pin = _pin_command("pin", True, """Hold MODEL at its active snapshot: changes are recorded, not deployed, until `unpin`.

    \b
    Example:
      tritonctl pin linear
    """)
unpin = _pin_command("unpin", False, """Release a pinned MODEL.

    \b
    Example:
      tritonctl unpin linear
    """)


@click.command()
@click.option("--keep", type=click.IntRange(min=0, max=MAX_COUNT), default=10, show_default=True,
              help="Snapshots to keep per model besides the active one.")
@json_option
@daemon_options
def gc(client: ControlClient, keep: int, as_json: bool) -> None:
    """Remove stored content of old snapshots (their history and audit rows stay).

    \b
    Example:
      tritonctl gc --keep 5
    """
    render.kv(client.gc(keep), as_json)


@click.command()
@json_option
@reader_options
def hosts(reader: Any, as_json: bool) -> None:
    """List the fleet's hosts: last heartbeat, alive, leader (from a fleet member's daemon, or --db-url).

    \b
    Examples:
      tritonctl hosts
      tritonctl hosts --db-url postgresql+psycopg://tritonctl@db/tritonctl
    """
    render.fleet_hosts(reader.hosts(), as_json)


@click.command()
@click.option("--open", "only_open", is_flag=True, help="Only rollouts still in progress.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until no rollout is open.")
@click.option("--interval", type=click.FloatRange(min=0.2, max=MAX_DURATION_S), default=1.0, show_default=True)
@click.option("--limit", type=click.IntRange(min=1, max=MAX_LIMIT), default=20, show_default=True)
@json_option
@reader_options
def rollouts(reader: Any, only_open: bool, watch: bool, interval: float, limit: int, as_json: bool) -> None:
    """Fleet rollouts, newest first, with each host's step (wave 0 is the canary set).

    Asks a fleet member's daemon, or with --db-url (TRITONCTL_DB_URL) reads the fleet's registry directly.

    \b
    Examples:
      tritonctl rollouts
      tritonctl rollouts --db-url postgresql+psycopg://tritonctl@db/tritonctl
      tritonctl rollouts --open --watch
    """
    if not watch:
        render.fleet_rollouts(reader.rollouts(only_open, limit), as_json)
        return
    while True:
        data = reader.rollouts(only_open, limit)
        render.fleet_rollouts(data, as_json)
        if not any(r["state"] in ("queued", "running", "rolling_back") for r in data):
            return
        time.sleep(interval)


COMMANDS = [load, unload, rollback, status, policy, pin, unpin, gc, hosts, rollouts, promote, abort]
