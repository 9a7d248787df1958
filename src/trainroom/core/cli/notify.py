"""`trainroom notify [--test] [RUN] [--json]`: the alert channels a run uses, and a test alert
through each of them with each result.

RUN given: that run's channels (its launch flags and the trainroom.toml of its project dir);
through its keeper when it lives (so the test goes the way real alerts go, and is journaled),
else from here. No RUN: the newest live run, else the trainroom.toml in force here (this dir,
then the state dir). Exit 0 when every channel delivered, 1 when one did not, 2 when there is
none. Channels are shown redacted: a target's secret is never printed.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from trainroom.core import config as cfg
from trainroom.core import sections
from trainroom.core.cli.errors import CliError
from trainroom.core.notify import alert as alerts
from trainroom.core.notify.channels import channels_from
from trainroom.core.notify.dispatch import Dispatcher
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.settings import NotifyOptions, notify_settings
from trainroom.core.units import to_json

NONE_CONFIGURED = (
    "no alert channels configured: add [notify] to trainroom.toml (README: Alerts and metrics) "
    "or pass --notify-* to `trainroom launch`"
)


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("notify", help="the alert channels of a run; --test sends a test alert through each")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--test", action="store_true", help="send a test alert through every channel")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_notify)


def _target(spec: str | None) -> tuple[RunInfo | None, sections.Notify, str, str]:
    """The run (None: none), the channels' policy, where it came from (for the header), and the
    dir a command hook runs in (the run's project dir, as under its keeper)."""
    info: RunInfo | None
    if spec:
        info = runs.resolve_run(spec)
    else:
        try:
            info = runs.resolve_run(None, live_only=True)
        except RunError:
            info = None
    if info is None:
        config, path = cfg.load_config(Path.cwd(), runs.state_dir())
        where = str(path) if path else "the defaults (no trainroom.toml here)"
        return None, notify_settings(NotifyOptions(), config.notify), where, os.getcwd()
    rec = runs.read_record(Path(info.run_dir))
    config, path = cfg.load_config(rec.cwd, runs.state_dir())
    where = f"run {info.run_id}" + (f" and {path}" if path else "")
    return info, notify_settings(rec.options.notify, config.notify), where, rec.cwd


def cmd_notify(args: argparse.Namespace) -> int:
    info, policy, where, cwd = _target(args.run)
    channels, unavailable = channels_from(policy, cwd=cwd, env=os.environ)
    if not args.test:
        names = [c.name for c in channels]
        if args.json:
            out = {"source": where, "min_severity": policy.min_severity, "states": policy.states}
            print(to_json({**out, "channels": names, "unavailable": dict(unavailable)}))
            return 0
        print(
            f"alert channels of {where} (findings at {policy.min_severity} or above; states {', '.join(policy.states)}):"
        )
        for name in names:
            print(f"  {name}")
        for name, why in unavailable:
            print(f"  {name}  (unavailable: {why})")
        if not names and not unavailable:
            print("  none")
        return 0
    if not channels and not unavailable:
        raise CliError(NONE_CONFIGURED)
    via = "keeper"
    results = _through_keeper(info) if info is not None and info.alive else None
    if results is None:
        via = "here"
        results = _from_here(info, policy, cwd)
    ok = all(r["outcome"] == "delivered" for r in results)
    if args.json:
        print(to_json({"source": where, "via": via, "ok": ok, "results": results}))
    else:
        print(
            f"test alert through the channels of {where} (sent from {'its keeper' if via == 'keeper' else 'here'}):"
        )
        for r in results:
            took = f" in {r['latency_s']:.2f} s" if r.get("latency_s") is not None else ""
            detail = f"  {r['detail']}" if r.get("detail") else ""
            print(f"  {r['outcome']:12} {r['channel']}{detail}{took}")
    return 0 if ok else 1


def _through_keeper(info: RunInfo) -> list[dict[str, Any]] | None:
    """The keeper's results, or None when it went away (the test is then sent from here)."""
    try:
        reply = KeeperClient(info.sock).call("notify-test", confirm=True, timeout_s=None)
    except KeeperGone:
        return None
    results = reply.after.get("results")
    if not isinstance(results, list):
        raise CliError(f"the keeper could not send a test alert: {reply.message}")
    return results


def _from_here(info: RunInfo | None, policy: sections.Notify, cwd: str) -> list[dict[str, Any]]:
    channels, unavailable = channels_from(policy, cwd=cwd, env=os.environ)
    results: list[dict[str, Any]] = [
        {"channel": name, "outcome": "unavailable", "detail": why, "latency_s": None}
        for name, why in unavailable
    ]
    run = info.run_id if info is not None else "(no run)"
    test = alerts.test_alert(run=run, host=os.uname().nodename, t=time.time(), state=None)
    dispatcher = Dispatcher(channels, policy, report=lambda _r: None)
    try:
        for fut in dispatcher.test(test):
            r = fut.result()
            results.append(
                {"channel": r.channel, "outcome": r.outcome, "detail": r.detail, "latency_s": r.latency_s}
            )
    finally:
        dispatcher.close(timeout_s=1.0)
    return results
