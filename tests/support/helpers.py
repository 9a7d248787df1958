"""Test helpers that start real keepers and read real status."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import msgspec

from trainroom.core.demo.launcher import demo_command, demo_options
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient, current_state
from trainroom.core.run.launch import launch
from trainroom.core.run.status import status_dict
from trainroom.core.run.store import RunInfo


def start_demo(
    fault: str = "none",
    steps: int | None = None,
    fault_step: int | None = None,
    step_delay: float | None = 0.0,
    ranks: int | None = None,
    extra: dict[str, Any] | None = None,
    **kw: Any,
) -> RunInfo:
    ns = argparse.Namespace(
        fault=fault,
        fault_step=fault_step,
        steps=steps,
        forever=steps is None,  # a test's run without --steps trains until the test ends it
        lr=kw.pop("lr", None),
        step_delay=step_delay,
        ckpt_every=kw.pop("ckpt_every", None),
        tracer=kw.pop("tracer", False),
        ranks=ranks,
        auto_resume=kw.pop("auto_resume", None),
        linger_s=kw.pop("linger_s", None),
    )
    opts = msgspec.structs.replace(demo_options(ns), **(extra or {}))
    from trainroom.core.demo.launcher import demo_dir

    return launch(demo_command(ns), opts, cwd=str(demo_dir()))


def status(info: RunInfo | str) -> dict[str, Any]:
    r = runs.resolve_run(info.run_id if isinstance(info, RunInfo) else info)
    st, alive = current_state(r)
    return status_dict(st, keeper_alive=alive)


def codes(d: dict[str, Any]) -> set[str]:
    return {f["code"] for f in d["findings"]}


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainroom.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def status_json(run: str) -> dict[str, Any]:
    out = run_cli("status", run, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def series_of(info: RunInfo) -> dict[str, Any]:
    """The plot series the keeper sends in its snapshot, as builtins (marks, loss_baseline, ...)."""
    c = KeeperClient(info.sock)
    try:
        out = msgspec.to_builtins(c.subscribe_view(client="test-series", live=False).series.snapshot())
        assert isinstance(out, dict)
        return out
    finally:
        c.close()
