"""What `attach` reads of a process from its arguments, its descriptors and the kernel log."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.support.waiting import wait_for
from trainroom.core.keeper.adopt import UNKNOWN, kernel_cause
from trainroom.core.probes.adopt import AdoptRefused, ckpt_dir_from, has_torch, inspect, log_of


@pytest.mark.parametrize(
    ("argv", "found"),
    [
        (["python", "train.py", "--output_dir", "runs/a"], ("/w/runs/a", "--output_dir")),
        (["python", "train.py", "--output-dir=/abs/b"], ("/abs/b", "--output-dir")),
        (["python", "train.py", "config/x.py", "out_dir=out-shakespeare"], ("/w/out-shakespeare", "out_dir")),
        (["python", "train.py", "--out_dir=out"], ("/w/out", "--out_dir")),
        (["python", "fit.py", "trainer.callbacks.dirpath=ck"], ("/w/ck", "trainer.callbacks.dirpath")),
        (["python", "train.py", "--save_dir", "s"], ("/w/s", "--save_dir")),
        (["python", "train.py", "output_dir"], (None, None)),  # a bare word is not the flag
        (["python", "train.py", "--lr", "3e-4"], (None, None)),
    ],
)
def test_the_checkpoint_directory_comes_from_the_usual_arguments(
    argv: list[str], found: tuple[str | None, str | None]
) -> None:
    assert ckpt_dir_from(argv, "/w") == found


def test_the_log_is_stdout_when_it_is_a_regular_file_and_said_otherwise(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(["sleep", "30"], stdout=f, stderr=subprocess.PIPE)
    try:
        assert log_of(proc.pid) == (str(log), f"its stdout (/proc/{proc.pid}/fd/1)")
    finally:
        proc.kill()
        proc.wait()
    proc = subprocess.Popen(["sleep", "30"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        path, why = log_of(proc.pid)
        assert path is None and "stdout is pipe:" in why and "stderr is pipe:" in why
    finally:
        proc.kill()
        proc.wait()


def test_a_process_without_torch_is_refused_in_words() -> None:
    proc = subprocess.Popen(["sleep", "30"], env=os.environ | {"ADOPT_TEST_MARK": "m1"})
    try:
        # (its command line is readable once the exec has been seen through /proc)
        wait_for(
            lambda: psutil.Process(proc.pid).cmdline() == ["sleep", "30"], timeout=30, what="sleep running"
        )
        assert not has_torch(proc.pid)
        with pytest.raises(AdoptRefused, match=r"is not a trainer: no torch loaded and no GPU context"):
            inspect(proc.pid)
        # A GPU context the driver lists makes it a trainer even without torch (a JAX or C++ job).
        a = inspect(proc.pid, gpu_pids=lambda: {proc.pid})
        assert a.pid == proc.pid and a.argv == ["sleep", "30"] and a.env["ADOPT_TEST_MARK"] == "m1"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(AdoptRefused, match="no such process"):
        inspect(proc.pid)
    with pytest.raises(AdoptRefused, match="not a trainer"):
        inspect(os.getpid())


def test_the_kernel_log_names_an_oom_kill_of_that_pid_only(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(
        b"6,100,5,-;Out of memory: Killed process 4242 (python) total-vm:1000kB, anon-rss:900kB\n"
    )
    assert "the OOM killer ended it (kernel log: Out of memory: Killed process 4242" in kernel_cause(
        4242, str(kmsg)
    )
    assert kernel_cause(424, str(kmsg)) == "the kernel log names no OOM kill of it"
    assert "is not readable here" in kernel_cause(4242, str(tmp_path / "missing"))
    assert UNKNOWN == "exit status unknown (attached, not its parent)"
