"""Starting a run: check the command and the config, create the run dir and record, start its
keeper detached (`python -m trainroom.core.keeper RUN_DIR` in its own session, every standard
stream away from the caller), and return once the keeper's socket is up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from trainroom.core.configuration.argtypes import log_pattern_problem
from trainroom.core.configuration.config import load_config
from trainroom.core.configuration.sections import ConfigError
from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.run import store as runs
from trainroom.core.run.store import RunError, RunInfo

KEEPER_WAIT_S = 10.0


def check_command(argv: list[str], cwd: str) -> None:
    if not argv:
        raise RunError("launch needs a command after `--`, e.g. trainroom launch -- python train.py")
    exe = argv[0]
    if os.sep in exe:
        path = exe if os.path.isabs(exe) else os.path.join(cwd, exe)
        if not os.path.isfile(path):
            raise RunError(f"command not found: {exe}")
        if not os.access(path, os.X_OK):
            raise RunError(f"command is not executable: {exe}")
    elif shutil.which(exe) is None:
        raise RunError(f"command not found: {exe}")


def check_config(cwd: str) -> None:
    """A bad trainroom.toml is refused here, before any keeper starts (the keeper would only
    fall back to the defaults with a note, and the run would use settings nobody wrote)."""
    try:
        load_config(cwd, runs.state_dir())
    except ConfigError as exc:
        raise RunError(str(exc)) from None


def launch_options(options: LaunchOptions | Mapping[str, object]) -> LaunchOptions:
    """Options as given, checked: a mapping is validated field by field (a bad one is a RunError
    that names it)."""
    if isinstance(options, LaunchOptions):
        return options
    try:
        return msgspec.convert(dict(options), LaunchOptions)
    except msgspec.ValidationError as exc:
        raise RunError(f"bad launch option: {exc}") from None


def check_options(opts: LaunchOptions) -> None:
    """What the keeper would refuse at start, refused here before a run exists."""
    why = log_pattern_problem(opts.log_pattern) if opts.log_pattern is not None else None
    if why:
        raise RunError(f"--log-pattern: {why}")


def _mark_failed(run_dir: Path, why: str) -> None:
    """A run whose keeper never came up says so, instead of reading `starting` forever."""
    try:
        rec = runs.read_record(run_dir)
        rec.start_error = why
        runs.write_record(run_dir, rec)
    except (RunError, OSError):
        pass


def launch(
    argv: list[str],
    options: LaunchOptions | Mapping[str, object] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    wait_s: float = KEEPER_WAIT_S,
) -> RunInfo:
    """Start a keeper for `argv` in its own session and return once its socket is up."""
    return launch_keeper(argv, options, cwd, env, wait_s)[0]


def launch_keeper(
    argv: list[str],
    options: LaunchOptions | Mapping[str, object] | None = None,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    wait_s: float = KEEPER_WAIT_S,
) -> tuple[RunInfo, subprocess.Popen[bytes]]:
    """`launch`, and the keeper's process: a foreground launch waits on it."""
    cwd = os.path.abspath(cwd or os.getcwd())
    opts = launch_options(options or LaunchOptions())
    check_command(argv, cwd)
    check_config(cwd)
    check_options(opts)
    run_dir, rec = runs.create_run(argv, cwd, opts)
    return spawn_keeper(run_dir, rec, env, wait_s)


def start_keeper(
    run_dir: Path, rec: runs.RunRecord, env: Mapping[str, str] | None = None, wait_s: float = KEEPER_WAIT_S
) -> RunInfo:
    """Start the keeper of a run already recorded (`launch`, `attach`) in its own session and
    return once its socket is up."""
    return spawn_keeper(run_dir, rec, env, wait_s)[0]


def spawn_keeper(
    run_dir: Path, rec: runs.RunRecord, env: Mapping[str, str] | None = None, wait_s: float = KEEPER_WAIT_S
) -> tuple[RunInfo, subprocess.Popen[bytes]]:
    """`start_keeper`, and the keeper's process: a foreground launch waits on it."""
    argv = rec.argv
    keeper_env = dict(env if env is not None else os.environ)
    if keeper_env.get("TRAINROOM_HOME"):
        # The keeper runs in its run directory: a relative home must not mean another place there.
        keeper_env["TRAINROOM_HOME"] = str(Path(keeper_env["TRAINROOM_HOME"]).expanduser().absolute())
    # Every standard stream is detached: `run=$(trainroom launch ...)` must not wait on the keeper.
    with open(run_dir / runs.KEEPER_LOG_NAME, "ab") as klog:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainroom.core.keeper", str(run_dir)],
            stdin=subprocess.DEVNULL,
            stdout=klog,
            stderr=klog,
            start_new_session=True,
            close_fds=True,
            cwd=str(run_dir),
            env=keeper_env,
        )
    sock = run_dir / runs.SOCKET_NAME
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if sock.exists():
            break
        if proc.poll() is not None:
            tail = (run_dir / runs.KEEPER_LOG_NAME).read_text(errors="replace").strip().splitlines()[-1:]
            why = f"keeper exited at start ({proc.returncode}): {tail[0] if tail else 'no output'}"
            _mark_failed(run_dir, why)
            raise RunError(why)
        time.sleep(0.01)
    else:
        why = f"keeper did not open {sock} within {wait_s:.0f} s (see {run_dir / runs.KEEPER_LOG_NAME})"
        _mark_failed(run_dir, why)
        raise RunError(why)
    info = RunInfo(
        run_id=rec.run_id, run_dir=str(run_dir), sock=str(sock), created=rec.created, argv=argv, alive=True
    )
    return info, proc
