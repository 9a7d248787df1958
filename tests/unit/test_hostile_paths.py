"""What is not trainroom's is never touched: a state dir another user owns or can write into is
refused at launch (saying which and how to fix it); a DCP `.metadata` naming a shard outside the
checkpoint directory is refused without opening it, and a `.metadata` that is a symlink is never
read through (no byte of what it points at in the reason); the NCCL flight-recorder trigger never
writes through a symlink planted at `<prefix><rank>.pipe`, nor into anything but a FIFO."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.ckpt_makers.dcp_save import save
from trainroom.core.ckpt import dirs, targets
from trainroom.core.ckpt.verify import verify
from trainroom.core.ops import flight
from trainroom.core.run import store as runs
from trainroom.core.run.store import RunError


def test_a_state_dir_others_can_write_or_another_user_owns_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    home.chmod(0o777)
    with pytest.raises(RunError, match=r"is mode 0777: writable by its group or others.*chmod go-w"):
        runs.ensure_runs_dir()
    assert not (home / "runs").exists()
    home.chmod(0o700)
    (home / "runs").mkdir(mode=0o700)
    os.chown(home / "runs", 65534, 65534)  # prepared by another user
    with pytest.raises(RunError, match=r"runs is owned by uid 65534, not you"):
        runs.ensure_runs_dir()
    os.chown(home / "runs", os.geteuid(), os.getegid())
    assert runs.ensure_runs_dir() == home / "runs"
    # The CLI: one line, exit 2, before anything runs.
    home.chmod(0o770)
    out = subprocess.run(
        [sys.executable, "-m", "trainroom.cli", "launch", "--", sys.executable, "-c", "pass"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TRAINROOM_HOME": str(home)},
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is mode 0770" in out.stderr and "Traceback" not in out.stderr


def _dcp(tmp_path: Path) -> Path:
    d = tmp_path / "step-10"
    save(str(d), step=10)
    return d


def test_a_dcp_shard_outside_the_checkpoint_is_refused_unopened(tmp_path: Path) -> None:
    d = _dcp(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0 " * 1000)
    md = dirs.read_dcp_metadata(d)
    for info in md.storage_data.values():
        info.relative_path = str(secret)  # an absolute path to a file that is not the checkpoint's
    with open(d / targets.DCP_METADATA, "wb") as f:
        pickle.dump(md, f)
    rep = verify(d)
    assert not rep.ok and rep.reason is not None
    assert "names a file outside the checkpoint directory: refused, not opened" in rep.reason

    # A shard that is a symlink out of the directory.
    d2 = tmp_path / "two" / "step-10"
    save(str(d2), step=10)
    (d2 / "__0_0.distcp").unlink()
    (d2 / "__0_0.distcp").symlink_to(secret)
    rep = verify(d2)
    assert not rep.ok and any(
        "__0_0.distcp: is a symbolic link: refused, not opened" in x for x in rep.problems
    )


def test_a_metadata_that_is_a_symlink_is_not_read_through_and_no_byte_leaks(tmp_path: Path) -> None:
    d = _dcp(tmp_path)
    secret = tmp_path / "shadow"
    secret.write_bytes(b"rQ7-secret-bytes\n")
    (d / targets.DCP_METADATA).unlink()
    (d / targets.DCP_METADATA).symlink_to(secret)
    rep = verify(d)
    assert not rep.ok
    said = " ".join(rep.problems)
    assert "rQ7" not in said and "'r'" not in said
    # A regular .metadata of garbage: the unpickler's message quotes its first byte; not here.
    (d / targets.DCP_METADATA).unlink()
    (d / targets.DCP_METADATA).write_bytes(b"rQ7-secret-bytes\n")
    rep = verify(d)
    said = " ".join(rep.problems)
    assert ".metadata: corrupt" in said and "'r'" not in said and "rQ7" not in said


def test_the_flight_recorder_trigger_refuses_a_planted_symlink_and_a_plain_file(tmp_path: Path) -> None:
    prefix = str(tmp_path / "nccl_pipe_")
    env = {**os.environ, "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": prefix}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    try:
        pipe = Path(f"{prefix}0.pipe")
        target = tmp_path / "not-a-pipe"
        target.write_bytes(b"")
        pipe.symlink_to(target)
        got = flight.trigger(proc.pid, 0)
        assert not got.triggered and "a symbolic link, not the FIFO NCCL makes" in got.detail
        assert target.read_bytes() == b""
        pipe.unlink()
        pipe.write_bytes(b"")
        got = flight.trigger(proc.pid, 0)
        assert not got.triggered and "not a FIFO" in got.detail and pipe.read_bytes() == b""
        pipe.unlink()
        os.mkfifo(pipe)
        heard: list[bytes] = []
        reader = threading.Thread(target=lambda: heard.append(pipe.read_bytes()))
        reader.start()
        for _ in range(200):
            got = flight.trigger(proc.pid, 0)
            if got.triggered:
                break
            threading.Event().wait(0.05)
        reader.join(timeout=30)
        assert got is not None and got.triggered and heard == [b"1"]
    finally:
        proc.kill()
        proc.wait()
