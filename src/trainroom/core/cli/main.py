"""The `trainroom` command. Bad input is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from trainroom.core.config import ConfigError
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, KeeperGone, snapshot
from trainroom.core.run.status import status_dict
from trainroom.core.run.store import RunError, RunInfo

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """One line for the user; exit code 2."""


# ---------------------------------------------------------------------------- launch


def _check_command(argv: list[str], cwd: str) -> None:
    if not argv:
        raise CliError("launch needs a command after `--`, e.g. trainroom launch -- python train.py")
    exe = argv[0]
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(cwd, exe)
        if not os.path.isfile(path):
            raise CliError(f"command not found: {exe}")
        if not os.access(path, os.X_OK):
            raise CliError(f"command is not executable: {exe}")
    elif shutil.which(exe) is None:
        raise CliError(f"command not found: {exe}")


def _check_config(cwd: str) -> None:
    """A bad trainroom.toml is refused here, before any keeper starts (the keeper would only
    fall back to the defaults with a note, and the run would use settings nobody wrote)."""
    from trainroom.core.config import ConfigError, load_config

    try:
        load_config(cwd, runs.state_dir())
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def launch(
    argv: list[str],
    options: dict[str, Any],
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    wait_s: float = 10.0,
) -> RunInfo:
    """Start a keeper for `argv` in its own session and return once its socket is up."""
    cwd = os.path.abspath(cwd or os.getcwd())
    _check_command(argv, cwd)
    _check_config(cwd)
    run_dir, rec = runs.create_run(argv, cwd, options)
    klog = open(run_dir / runs.KEEPER_LOG_NAME, "ab")
    # Every standard stream is detached: `run=$(trainroom launch ...)` must not wait on the keeper.
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainroom.core.keeper", str(run_dir)],
        stdin=subprocess.DEVNULL,
        stdout=klog,
        stderr=klog,
        start_new_session=True,
        close_fds=True,
        cwd=str(run_dir),
        env=env,
    )
    klog.close()
    sock = run_dir / runs.SOCKET_NAME
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if sock.exists():
            break
        if proc.poll() is not None:
            tail = (run_dir / runs.KEEPER_LOG_NAME).read_text(errors="replace").strip().splitlines()[-1:]
            raise CliError(f"keeper exited at start ({proc.returncode}): {tail[0] if tail else 'no output'}")
        time.sleep(0.01)
    else:
        raise CliError(
            f"keeper did not open {sock} within {wait_s:.0f} s (see {run_dir / runs.KEEPER_LOG_NAME})"
        )
    return RunInfo(
        run_id=rec.run_id, run_dir=str(run_dir), sock=str(sock), created=rec.created, argv=argv, alive=True
    )


def _launch_options(args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    for key in ("ckpt_root", "log_pattern", "linger_s", "auto_resume", "resume_template", "keep"):
        val = getattr(args, key, None)
        if val is not None:
            opts[key] = os.path.abspath(val) if key == "ckpt_root" else val
    if getattr(args, "lock_file", None):
        opts["lock_files"] = [os.path.abspath(x) for x in args.lock_file]
    if getattr(args, "watch_ckpt", None):
        opts["watch_ckpt"] = list(args.watch_ckpt)
    if getattr(args, "keep_verified_copies", False):
        opts["keep_verified_copies"] = True
    if getattr(args, "disk_budget", None):
        opts["disk_budget_bytes"] = _parse_size(args.disk_budget)
    return opts


def _parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        return int(float(num) * units[unit])
    except ValueError:
        raise CliError(f"bad size {text!r}: expected e.g. 500M or 20G") from None


def _add_launch_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ckpt-root", dest="ckpt_root", help="checkpoint root (default: <run dir>/checkpoints)")
    sp.add_argument(
        "--log-pattern",
        dest="log_pattern",
        help="regex with named groups step, loss and optional lr for log-line telemetry",
    )
    sp.add_argument(
        "--linger",
        dest="linger_s",
        type=float,
        help="seconds the keeper stays after the trainer ends with no client (default 3600)",
    )
    sp.add_argument(
        "--auto-resume",
        dest="auto_resume",
        type=int,
        metavar="N",
        help="resume by itself at most N times when the death criteria hold",
    )
    sp.add_argument(
        "--resume-template",
        dest="resume_template",
        help="the command for a resume; {ckpt} and {ckpt_dir} are replaced",
    )
    sp.add_argument("--lock-file", dest="lock_file", action="append", help="a lock file the trainer holds")
    sp.add_argument(
        "--watch-ckpt",
        dest="watch_ckpt",
        action="append",
        metavar="GLOB",
        help="checkpoint files an uninstrumented trainer writes (verified once stable)",
    )
    sp.add_argument(
        "--keep-verified-copies",
        action="store_true",
        help="keep a verified copy of each watched checkpoint version",
    )
    sp.add_argument("--keep", type=int, help="verified checkpoints prune keeps (default 2)")
    sp.add_argument("--disk-budget", dest="disk_budget", help="bytes the checkpoint root may use, e.g. 50G")


def cmd_launch(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    info = launch(argv, _launch_options(args))
    print(info.run_id)
    return 0


# ---------------------------------------------------------------------------- status / runs


def current_state(info: RunInfo) -> tuple[Any, bool]:
    """The run from its keeper, or from its journal when the keeper is gone."""
    if info.alive:
        try:
            return snapshot(info.sock), True
        except KeeperGone:
            pass
    return runs.load_state(info.run_dir), False


def _fmt_bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"


def status_lines(d: dict[str, Any]) -> list[str]:
    ex = d["exit"]
    end = ""
    if ex["signal"] is not None:
        end = f" (killed by {ex['signal_name']})"
    elif ex["code"] is not None:
        end = f" (exit {ex['code']})"
    loss = d["loss"]
    loss_s = f"{loss:.4f}" if isinstance(loss, float) else str(loss)
    lr = d["lr"]
    eff = lr["effective"][0] if lr["effective"] else None
    lines = [
        f"{d['run']}  {d['state'].upper()}{end}  attempt {d['attempt']}  pid {d['pid']}  keeper {d['keeper']}",
        f"  step {d['step']}  age {d['step_age_s']} s  {d['steps_per_s'] or '?'} steps/s  loss {loss_s}"
        f"  lr {eff if eff is not None else '?'} (asked {lr['requested'] if lr['requested'] is not None else '?'})",
    ]
    v = d["vram"]
    if v["driver_available"]:
        lines.append(
            f"  vram driver {_fmt_bytes(v['driver_used_bytes'])}/{_fmt_bytes(v['driver_total_bytes'])}"
            f"  allocator {_fmt_bytes(v['allocator_reserved_bytes'])}"
        )
    else:
        lines.append(f"  {v['driver_reason'] or 'driver view unavailable: not probed yet'}")
    h = d["host"]
    if h["mem_available_bytes"] is not None:
        lines.append(
            f"  host available {_fmt_bytes(h['mem_available_bytes'])}  page cache "
            f"{_fmt_bytes(h['page_cache_bytes'])}  disk {d['disk']['used_fraction']}"
        )
    for f in d["findings"]:
        key = f" [{f['action']}]" if f["action"] else ""
        lines.append(f"  {f['severity'].upper():8} {f['code']}: {f['message']}{key}")
    return lines


def cmd_status(args: argparse.Namespace) -> int:
    info = runs.resolve_run(args.run)
    st, alive = current_state(info)
    d = status_dict(st, keeper_alive=alive)
    if args.json:
        print(json.dumps(d, indent=2, default=str))
    else:
        print("\n".join(status_lines(d)))
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    rows = runs.list_runs()
    if args.json:
        out = []
        for r in rows:
            try:
                st, alive = current_state(r)
                out.append(
                    {
                        "run": r.run_id,
                        "alive": alive,
                        "state": status_dict(st, keeper_alive=alive)["state"],
                        "argv": r.argv,
                        "run_dir": r.run_dir,
                        "created": r.created,
                    }
                )
            except RunError as exc:
                out.append({"run": r.run_id, "alive": False, "state": None, "error": str(exc)})
        print(json.dumps(out, indent=2))
        return 0
    if not rows:
        print(f"no runs under {runs.runs_dir()}")
        return 0
    for r in rows:
        try:
            st, alive = current_state(r)
            state = status_dict(st, keeper_alive=alive)["state"]
        except RunError:
            state = "?"
        print(
            f"{r.run_id:40} {state:9} {'keeper up' if r.alive else 'keeper gone':12} {' '.join(r.argv)[:60]}"
        )
    return 0


# ---------------------------------------------------------------------------- actions via the keeper


def _evidence(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def cmd_action(args: argparse.Namespace) -> int:
    """kill / reclaim / resume / dump / prune / verify-latest through the keeper, with a confirmation."""
    info = runs.resolve_run(args.run)
    if not info.alive:
        raise CliError(f"the keeper of {info.run_id} is gone; `trainroom launch` starts a new run")
    client = KeeperClient(info.sock)
    req_args: dict[str, Any] = {}
    for key in ("keep", "dry_run", "grace_s", "device", "seconds"):
        if getattr(args, key, None) is not None:
            req_args[key] = getattr(args, key)
    plan = client.call(args.action, req_args, confirm=False)
    if plan.stage == "done" and not plan.ok:
        return _print_reply(args, plan)
    if not args.json:
        print(plan.message)
        for k, v in plan.plan.items():
            print(f"  {k}: {v}")
    # Only what changes the run asks first; a bench or a stack dump does not.
    confirm = args.yes or args.action in ("bench", "dump")
    if not confirm:
        if not sys.stdin.isatty():
            raise CliError(f"{args.action} needs confirmation: pass --yes (stdin is not a terminal)")
        confirm = input(f"{args.action}? [y/N] ").strip().lower() in ("y", "yes")
        if not confirm:
            print("cancelled")
            return 1
    last = None
    for r in client.request(args.action, req_args, confirm=True):
        last = r
        if r.stage == "progress" and not args.json:
            print(f"  … {r.message}")
    assert last is not None
    return _print_reply(args, last)


def cmd_bench(args: argparse.Namespace) -> int:
    """Through the run's keeper (on the trainer's device and interpreter) when one is up, else
    here: the bench needs no run, only torch."""
    from trainroom.core.ops import bench as bench

    if args.run:
        info = runs.resolve_run(args.run)
        if not info.alive:
            print(f"trainroom: the keeper of {info.run_id} is gone: benching here", file=sys.stderr)
            return bench.run(args)
    else:
        try:
            info = runs.resolve_run(None, live_only=True)
        except RunError:
            return bench.run(args)
    args.run = info.run_id
    return cmd_action(args)


def _print_reply(args: argparse.Namespace, r: Any) -> int:
    if args.json:
        print(
            json.dumps(
                {
                    "action": r.action,
                    "ok": r.ok,
                    "message": r.message,
                    "plan": r.plan,
                    "before": r.before,
                    "after": r.after,
                },
                indent=2,
                default=str,
            )
        )
    else:
        print(("ok: " if r.ok else "refused: ") + r.message)
        if r.before:
            print(f"  before: {_evidence(r.before)}")
        if r.after:
            print(f"  after:  {_evidence(r.after)}")
    return 0 if r.ok else 1


# ---------------------------------------------------------------------------- demo / tui


def cmd_demo(args: argparse.Namespace) -> int:
    from trainroom.core.demo.launcher import run_demo

    return run_demo(args)


OpenTui = Callable[[argparse.Namespace], int]
_open_tui: OpenTui | None = None


def open_tui(args: argparse.Namespace) -> int:
    """Open the control room through the hook the console script installed (the core itself
    never imports the TUI)."""
    if _open_tui is None:
        raise CliError("the control room is not available from here: run the `trainroom` command")
    return _open_tui(args)


def cmd_watch(args: argparse.Namespace) -> int:
    return open_tui(args)


# ---------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trainroom", description=__doc__)
    ap.add_argument("--theme", help="control room theme (dark, light, high-contrast, ...)")
    sub = ap.add_subparsers(dest="cmd")

    sp = sub.add_parser("launch", help="start a trainer detached, under a keeper; prints the run id")
    _add_launch_options(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ...")
    sp.set_defaults(func=cmd_launch)

    sp = sub.add_parser("status", help="the state of a run (default: the newest)")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("runs", help="list runs")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=cmd_runs)

    sp = sub.add_parser("watch", help="open the control room on a run")
    sp.add_argument("run", nargs="?")
    sp.add_argument("--theme", dest="watch_theme")
    sp.set_defaults(func=cmd_watch)

    from trainroom.core.demo.launcher import add_demo_parser

    add_demo_parser(sub, cmd_demo)

    for action, text in (
        ("kill", "kill the trainer's process group (SIGTERM, grace, SIGKILL)"),
        ("reclaim", "drop the page cache the way this host allows"),
        ("resume", "start a new attempt from the last verified checkpoint"),
        ("dump", "dump the trainer's stacks"),
        ("bench", "matmul TFLOPS on the run's device (here, with no live keeper)"),
    ):
        sp = sub.add_parser(action, help=text)
        sp.add_argument("run", nargs="?")
        sp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        sp.add_argument("--json", action="store_true")
        if action == "kill":
            sp.add_argument("--grace", dest="grace_s", type=float)
        if action == "bench":
            from trainroom.core.ops.bench import add_device_options

            add_device_options(sp)
            sp.set_defaults(func=cmd_bench, action=action)
            continue
        sp.set_defaults(func=cmd_action, action=action)

    _add_module_verbs(sub)
    return ap


def _add_module_verbs(sub: Any) -> None:
    """Verbs whose code lives in their own module (verify, prune)."""
    from trainroom.core.cli import ckpt

    ckpt.add_parser(sub)


def main(argv: list[str] | None = None, open_tui: OpenTui | None = None) -> int:
    global _open_tui
    if open_tui is not None:
        _open_tui = open_tui
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if args.cmd is None:
            args.run = None
            args.watch_theme = None
            return cmd_watch(args)
        return int(args.func(args) or 0)
    except (CliError, RunError, KeeperGone, ConfigError) as exc:
        print(f"trainroom: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
