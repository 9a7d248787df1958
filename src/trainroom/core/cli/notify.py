"""`trainroom notify [--test] [RUN] [--json]`: the alert channels a run uses, and a test alert
through each of them with each result.

RUN given: that run's channels (its launch flags and the trainroom.toml of its project dir);
through its keeper when it lives (so the test goes the way real alerts go, and is journaled),
else from here. No RUN: the newest live run, else the trainroom.toml in force here (this dir,
then the state dir). Exit 0 when every channel delivered, 1 when one did not, 2 when there is
none. Channels are shown redacted: a target's secret is never printed; a command hook is shown in
full (only the secrets of URLs in it redacted) before it runs. From here, the command hooks of a
trainroom.toml you did not name (--config) run only when it is trusted the way git's safe.directory
is: it and its directory owned by you, neither writable by others; otherwise they are listed, not
run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import time
from pathlib import Path
from typing import Any

import msgspec

from trainroom.core.cli.errors import CliError
from trainroom.core.configuration import config as cfg
from trainroom.core.configuration import sections
from trainroom.core.configuration.settings import NotifyOptions, notify_settings
from trainroom.core.notify import alert as alerts
from trainroom.core.notify.channels import channels_from
from trainroom.core.notify.dispatch import Dispatcher
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.run.store import RunError, RunInfo
from trainroom.core.units import redact_url, to_json

NONE_CONFIGURED = (
    "no alert channels configured: add [notify] to trainroom.toml (README: Alerts and metrics) "
    "or pass --notify-* to `trainroom launch`"
)


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("notify", help="the alert channels of a run; --test sends a test alert through each")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--test", action="store_true", help="send a test alert through every channel")
    sp.add_argument(
        "--config",
        metavar="FILE",
        help="the trainroom.toml whose [notify] to use (named: trusted, its command hooks run)",
    )
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_notify)


class Source(msgspec.Struct, kw_only=True):
    """Where the channels come from: the run (None: none), the policy, the words for the header,
    the dir a command hook runs in, the config file read, and whether the user named it."""

    info: RunInfo | None
    policy: sections.Notify
    where: str
    cwd: str
    config_path: Path | None = None
    named: bool = False
    flag_commands: list[str] = []


def _target(spec: str | None, named: str | None = None) -> Source:
    """The run (None: none), the channels' policy, where it came from (for the header), and the
    dir a command hook runs in (the run's project dir, as under its keeper)."""
    info: RunInfo | None
    if named is not None:
        given = Path(named).expanduser().absolute()
        try:
            config = cfg.decode_config(given.read_bytes(), given)
        except OSError as exc:
            raise CliError(f"{given}: cannot read: {exc.strerror or exc}") from None
        return Source(
            info=None,
            policy=notify_settings(NotifyOptions(), config.notify),
            where=str(given),
            cwd=str(given.parent),
            config_path=given,
            named=True,
        )
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
        policy = notify_settings(NotifyOptions(), config.notify)
        return Source(info=None, policy=policy, where=where, cwd=os.getcwd(), config_path=path)
    rec = runs.read_record(Path(info.run_dir))
    config, path = cfg.load_config(rec.cwd, runs.state_dir())
    where = f"run {info.run_id}" + (f" and {path}" if path else "")
    return Source(
        info=info,
        policy=notify_settings(rec.options.notify, config.notify),
        where=where,
        cwd=rec.cwd,
        config_path=path,
        flag_commands=list(rec.options.notify.command),
    )


def untrusted(path: Path) -> str | None:
    """Why a config file's command hooks are not run unless it is named (None: trusted). git's
    safe.directory is the model: the file and its directory owned by you, neither writable by
    the group or others."""
    for what in (path, path.parent):
        try:
            st = what.stat()
        except OSError as exc:
            return f"{what} cannot be read ({exc.strerror or exc})"
        mode = st.st_mode & 0o7777
        if st.st_uid != os.geteuid():
            return f"{what} is owned by uid {st.st_uid}, not you"
        if mode & 0o022:
            return f"{what} is mode {mode:04o} (others can write it)"
    return None


def shown_command(command: str) -> str:
    """A command hook as it is reviewed before it runs: every word as it is, the secrets of the
    URLs in it redacted."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    return shlex.join(redact_url(w) if "://" in w else w for w in words)


def _trusted_policy(src: Source) -> tuple[sections.Notify, list[tuple[str, str]]]:
    """The policy with the command hooks of an untrusted config file left out (the flags' own
    stay: the user typed them), and why each left-out one is not run."""
    commands = sections.as_list(src.policy.command)
    if src.named or src.config_path is None:
        return src.policy, []
    why = untrusted(src.config_path)
    if why is None:
        return src.policy, []
    keep = [c for c in commands if c in src.flag_commands]
    refused = [
        (
            f"command {shown_command(c)}",
            f"not run: it comes from {src.config_path}, which is not trusted ({why}); review it and "
            f"pass --config {src.config_path} to run it",
        )
        for c in commands
        if c not in keep
    ]
    return msgspec.structs.replace(src.policy, command=keep), refused


def cmd_notify(args: argparse.Namespace) -> int:
    src = _target(args.run, getattr(args, "config", None))
    info, policy, where, cwd = src.info, src.policy, src.where, src.cwd
    channels, unavailable = channels_from(policy, cwd=cwd, env=os.environ)
    commands = [shown_command(c) for c in sections.as_list(policy.command)]
    if not args.test:
        names = [c.name for c in channels]
        if args.json:
            out = {"source": where, "min_severity": policy.min_severity, "states": policy.states}
            print(to_json({**out, "channels": names, "unavailable": dict(unavailable), "commands": commands}))
            return 0
        print(
            f"alert channels of {where} (findings at {policy.min_severity} or above; states {', '.join(policy.states)}):"
        )
        for name in names:
            print(f"  {name}")
        for c in commands:
            print(f"  command hook, in full: {c}")
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
        trusted, refused = _trusted_policy(src)
        if not args.json:
            for c in sections.as_list(trusted.command):
                print(f"running command hook: {shown_command(c)}", flush=True)
        results = [
            {"channel": n, "outcome": "unavailable", "detail": w, "latency_s": None} for n, w in refused
        ]
        results += _from_here(info, trusted, cwd)
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
