"""Checkpoints that must not be lost, and places that are not trainroom's to touch, against a real
keeper, a real SDK trainer (tests/support/gated_saver.py, which saves only when the test opens its
gate) and real files: a candidate replaced between its verdict and its promotion, a `latest`
replaced after it, a full disk during promotion (a real tmpfs), a quarantine that is a symlink out
of the root, and a state dir launch must not chmod."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.helpers import codes, run_cli, status
from tests.support.tmpfs import fill, tmpfs
from tests.support.waiting import kill_runs_under, wait_for
from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt.promote import digest_of
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

GATED = Path(__file__).parents[1] / "support" / "gated_saver.py"
TORCH_START_S = 180  # torch imported by the trainer and the warm verifier on a loaded machine


def _start(tmp_path: Path, steps: str, *, die: bool = False, **opts: Any) -> tuple[runs.RunInfo, Path]:
    gate = tmp_path / "gate"
    gate.mkdir()
    cmd = [sys.executable, str(GATED), "--gate", str(gate), "--steps", steps] + (["--die"] if die else [])
    return launch(cmd, opts, cwd=str(tmp_path)), gate


def _save(gate: Path, step: int) -> None:
    (gate / f"save-{step}").touch()
    wait_for(lambda: (gate / f"saved-{step}").exists(), timeout=TORCH_START_S, what=f"step {step} saved")


def _records(info: runs.RunInfo, path: Path) -> list[protocol.CheckpointState]:
    recs = journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
    return [r for r in recs if isinstance(r, protocol.CheckpointState) and r.path == str(path)]


def _keeper(info: runs.RunInfo) -> int:
    pid = runs.read_record(Path(info.run_dir)).keeper_pid
    assert pid
    return pid


def _verifier(info: runs.RunInfo) -> int | None:
    for c in psutil.Process(_keeper(info)).children(recursive=True):
        try:
            if "--serve" in c.cmdline():
                return c.pid
        except psutil.NoSuchProcess:
            continue
    return None


def _pipe_bytes(pid: int, fd: int) -> int:
    """Unread bytes in the pipe on `fd` of `pid` (opened through /proc, never read)."""
    f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return int(struct.unpack("i", fcntl.ioctl(f, termios.FIONREAD, b"\0\0\0\0"))[0])
    finally:
        os.close(f)


def _idle(pid: int) -> bool:
    """The verifier waits in read(0) for its next request, with nothing unread: a reply it owed
    has been written."""
    syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    return syscall[:2] == ["0", "0x0"] and _pipe_bytes(pid, 0) == 0


def _warm_verifier(info: runs.RunInfo) -> int:
    return int(
        wait_for(
            lambda: (v := _verifier(info)) is not None and _idle(v) and v,
            timeout=TORCH_START_S,
            what="the warm verifier waiting for work",
        )
    )


def _nan_same_size(path: Path) -> None:
    """Every tensor's bytes in a torch.save zip set to float32 NaN in place: same size, same
    names, other bytes (what the issue saw replace a candidate)."""
    with zipfile.ZipFile(path) as z:
        entries = [(i.header_offset, i.file_size) for i in z.infolist() if "/data/" in i.filename]
    with open(path, "r+b") as f:
        for offset, size in entries:
            f.seek(offset + 26)
            n, m = struct.unpack("<HH", f.read(4))
            f.seek(offset + 30 + n + m)
            f.write(struct.pack("<f", float("nan")) * (size // 4))


def _replace_with_nan(path: Path) -> None:
    """`path` replaced by rename with a same-size, all-NaN version of itself."""
    swap = path.with_name(".swap-" + path.name)
    swap.write_bytes(path.read_bytes())
    _nan_same_size(swap)
    assert swap.stat().st_size == path.stat().st_size
    os.replace(swap, path)


def test_a_candidate_replaced_after_its_verdict_is_verified_again_never_promoted(
    trhome: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ck"
    info, gate = _start(tmp_path, "10", ckpt_root=str(root))
    verifier = _warm_verifier(info)
    keeper = _keeper(info)
    os.kill(verifier, signal.SIGSTOP)
    try:
        _save(gate, 10)
        cand = root / ck.QUARANTINE / "step-000010.pt"
        # The keeper has asked the (stopped) verifier: the request waits in its stdin.
        wait_for(lambda: _pipe_bytes(verifier, 0) > 0, timeout=30, what="the verify request sent")
        os.kill(keeper, signal.SIGSTOP)
        try:
            os.kill(verifier, signal.SIGCONT)
            wait_for(lambda: _idle(verifier), timeout=120, what="the verdict written")
            # Between the verdict (good bytes) and the promotion: the candidate is replaced.
            _replace_with_nan(cand)
        finally:
            os.kill(keeper, signal.SIGCONT)
    finally:
        os.kill(verifier, signal.SIGCONT)

    def rejected() -> list[protocol.CheckpointState] | None:
        rs = _records(info, cand)
        return rs if any(r.state == "rejected" for r in rs) else None

    recs = wait_for(rejected, timeout=120, what="the replaced candidate verified again")
    states = [(r.state, r.reason or "") for r in recs]
    changed = [
        i for i, (s, why) in enumerate(states) if s == "candidate" and "changed since it was verified" in why
    ]
    assert changed, states
    assert states[-1][0] == "rejected" and not any(s == "verified" for s, _ in states), states
    # Nothing promoted, `latest` nowhere, the NaN bytes kept in quarantine with why.
    assert not [x for x in root.iterdir() if x.name.startswith(("step-", ".promote-"))]
    assert ck.latest_dir(root) is None and cand.exists()
    # ... and said on the keeper's next evaluation.
    wait_for(lambda: "CKPT_REJECTED" in codes(status(info)), timeout=30, what="CKPT_REJECTED said")
    (gate / "end").touch()


def test_prune_keeps_and_resume_falls_back_to_the_newest_checkpoint_that_verifies_now(
    trhome: Path, tmp_path: Path
) -> None:
    info, gate = _start(tmp_path, "10,20", die=True)
    root = runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)
    _save(gate, 10)
    wait_for(
        lambda: ck.latest_dir(root) == root / "step-000010", timeout=TORCH_START_S, what="step 10 promoted"
    )
    _save(gate, 20)
    wait_for(
        lambda: (s := status(info))["state"] == "dead" and ck.latest_dir(root) == root / "step-000020" and s,
        timeout=TORCH_START_S,
        what="step 20 promoted and the trainer dead",
    )
    good10 = root / "step-000010" / "step-000010.pt"
    bad20 = root / "step-000020" / "step-000020.pt"
    _replace_with_nan(bad20)  # `latest` itself replaced on disk, same size

    out = run_cli("prune", info.run_id, "--keep", "1", "--yes", "--json")
    # Nothing to delete: said as the answer, with what is kept and why (exit 1: nothing to do).
    assert out.returncode == 1, out.stderr
    res = json.loads(out.stdout)
    assert res["via"] == "keeper" and res["deleted"] == [] and "nothing to delete" in res["message"], res
    kept = {Path(k["path"]).name: k["why"] for k in res["kept"]}
    assert kept["step-000020"] == "latest" and "verifies now" in kept["step-000010"], kept
    assert good10.is_file() and digest_of(good10) == ck.read_manifest(good10.parent).digest  # type: ignore[union-attr]

    out = run_cli("resume", info.run_id, "--yes", "--json", timeout=180)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    plan = res["plan"]
    assert res["ok"] and plan["checkpoint"] == str(good10) and plan["step"] == 10, res
    assert "no longer matches its verified digest" in plan["note"] and str(good10) in plan["note"]
    d = wait_for(
        lambda: (s := status(info))["attempt"] == 2 and s["state"] == "exited" and s,
        timeout=TORCH_START_S,
        what="attempt 2 ends",
    )
    assert d["attempts"][1]["resume_from"] == str(good10)
    assert f"resumed from {good10}" in (Path(info.run_dir) / runs.LOG_NAME).read_text()


def test_a_full_disk_during_promotion_rolls_back_then_promotes_on_the_next_try(
    trhome: Path, tmp_path: Path
) -> None:
    with tmpfs("16m") as disk:
        root = disk / "ck"
        info, gate = _start(tmp_path, "10,20", ckpt_root=str(root))
        verifier = _warm_verifier(info)
        _save(gate, 10)
        wait_for(lambda: ck.latest_dir(root) == root / "step-000010", timeout=120, what="step 10 promoted")
        os.kill(verifier, signal.SIGSTOP)
        try:
            _save(gate, 20)
            wait_for(lambda: _pipe_bytes(verifier, 0) > 0, timeout=30, what="the verify request sent")
            fill(disk / "filler")
        finally:
            os.kill(verifier, signal.SIGCONT)
        cand = root / ck.QUARANTINE / "step-000020.pt"
        recs = wait_for(
            lambda: [r for r in _records(info, cand) if r.state == "rejected"],
            timeout=120,
            what="the promotion refused by the full disk",
        )
        assert "verified, but not promoted" in (recs[-1].reason or "") and "No space left" in (
            recs[-1].reason or ""
        )
        f = wait_for(
            lambda: next(
                (
                    f
                    for f in status(info)["findings"]
                    if f["code"] == "CKPT_REJECTED" and f["key"] == str(cand)
                ),
                None,
            ),
            timeout=30,
            what="CKPT_REJECTED said",
        )
        # What the finding says is so: in quarantine, nothing hidden left, `latest` as it was.
        assert "it stays in quarantine and `latest` is left as it was" in f["message"]
        assert cand.is_file() and not [x for x in root.iterdir() if x.name.startswith(".promote-")]
        assert os.readlink(root / ck.LATEST) == "step-000010"
        assert [x.name for x in root.iterdir() if x.name.startswith("step-")] == ["step-000010"]
        # Space again: the keeper's next try promotes it.
        (disk / "filler").unlink()
        wait_for(
            lambda: ck.latest_dir(root) == root / "step-000020",
            timeout=120,
            what="step 20 promoted on the next try",
        )
        assert not cand.exists()
        wait_for(
            lambda: _records(info, cand)[-1].state == "verified", timeout=30, what="the verdict journaled"
        )
        (gate / "end").touch()
        kill_runs_under(trhome)


def test_a_quarantine_that_is_a_symlink_out_of_the_root_is_refused_and_nothing_outside_touched(
    trhome: Path, tmp_path: Path
) -> None:
    root = tmp_path / "ck"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    # What the sweep would take for a dead writer's temp file, were it inside the root.
    victim = outside / ".step-000005.pt.999999.tmp"
    victim.write_bytes(b"someone else's")
    (root / ck.QUARANTINE).symlink_to(outside)
    info, gate = _start(tmp_path, "10", ckpt_root=str(root))
    f = wait_for(
        lambda: next(
            (f for f in status(info)["findings"] if f["code"] == "CKPT_OUTSIDE_ROOT"),
            None,
        ),
        timeout=60,
        what="CKPT_OUTSIDE_ROOT for the quarantine",
    )
    assert "symbolic link" in f["message"] and str(root / ck.QUARANTINE) in f["message"]
    _save(gate, 10)
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert "save of step 10 refused: CheckpointError: refusing the quarantine" in log, log[-2000:]
    assert sorted(x.name for x in outside.iterdir()) == [victim.name]
    assert victim.read_bytes() == b"someone else's"
    (gate / "end").touch()


@pytest.fixture
def shared_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A world-writable sticky directory as TRAINROOM_HOME, as /tmp/shared would be."""
    home = Path(tempfile.mkdtemp(prefix="trh", dir="/tmp"))
    home.chmod(0o1777)
    monkeypatch.setenv("TRAINROOM_HOME", str(home))
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    try:
        yield home
    finally:
        kill_runs_under(home)
        subprocess.run(["rm", "-rf", str(home)], check=False)


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_launch_leaves_an_existing_state_dir_mode_alone_and_status_warns(shared_home: Path) -> None:
    info = launch(SLEEPER, {}, cwd=str(shared_home))
    assert stat.S_IMODE(shared_home.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared_home / "runs").stat().st_mode) == 0o700  # created here: private
    assert stat.S_IMODE(Path(info.run_dir).stat().st_mode) == 0o700  # the socket's own dir
    out = run_cli("status", info.run_id, "--json")
    assert out.returncode == 0, out.stderr
    assert any("mode 1777" in w for w in json.loads(out.stdout)["warnings"])
    out = run_cli("status", info.run_id)
    assert out.returncode == 0 and "warning: state dir" in out.stderr and "mode 1777" in out.stderr


def test_a_relative_trainroom_home_works_and_the_cwd_keeps_its_mode() -> None:
    project = Path(tempfile.mkdtemp(prefix="trp", dir="/tmp"))  # short: a socket path must fit
    project.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "TRAINROOM_SOCKET"}
    try:
        for home, where in ((".", project), ("state/tr", project / "state" / "tr")):
            env["TRAINROOM_HOME"] = home
            out = subprocess.run(
                [sys.executable, "-m", "trainroom.cli", "launch", "--", *SLEEPER],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            assert out.returncode == 0, out.stderr
            run_id = out.stdout.strip()
            assert (where / "runs" / run_id).is_dir()
            got = subprocess.run(
                [sys.executable, "-m", "trainroom.cli", "status", run_id, "--json"],
                cwd=project,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert got.returncode == 0, got.stderr
            assert json.loads(got.stdout)["state"] in ("starting", "running")
        assert stat.S_IMODE(project.stat().st_mode) == 0o755
        assert stat.S_IMODE((project / "state" / "tr").stat().st_mode) == 0o700  # created by launch
    finally:
        kill_runs_under(project)
        kill_runs_under(project / "state" / "tr")
        subprocess.run(["rm", "-rf", str(project)], check=False)


NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"


def test_a_nanogpt_resume_gets_its_own_out_dir_back_never_the_verified_copy(
    trhome: Path, tmp_path: Path
) -> None:
    work = tmp_path / "nanogpt"
    work.mkdir()
    script = f"{sys.executable} {NANOGPT_LIKE} --iters 30 --save-every 10"
    info = launch(
        [*script.split(), "--wait-copies", "--die-at", "15"],
        {
            "watch_ckpt": ["out/*.pt"],
            "keep_verified_copies": True,
            "resume_template": f"{script} --init_from resume --out_dir {{ckpt_dir}}",
        },
        cwd=str(work),
    )
    watched = work / "out" / "ckpt.pt"
    root = runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)
    copy10 = root / "step-000010" / "ckpt.pt"
    wait_for(
        lambda: status(info)["state"] == "dead" and ck.latest_checkpoint(root) == copy10,
        timeout=TORCH_START_S,
        what="iter 10 verified and copied, the trainer dead at 15",
    )
    # A save torn by the death: the trainer's own file no longer holds what verified.
    torn = watched.read_bytes()[: watched.stat().st_size // 2]
    watched.write_bytes(torn)
    wait_for(
        lambda: any(r.state == "rejected" for r in _records(info, watched)),
        timeout=120,
        what="the torn ckpt.pt rejected",
    )

    out = run_cli("resume", info.run_id, "--yes", "--json", timeout=180)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    plan = res["plan"]
    assert res["ok"] and plan["checkpoint"] == str(watched) and plan["step"] == 10, res
    assert plan["restore_from"] == str(copy10)
    assert plan["argv"][-2:] == ["--out_dir", str(watched.parent)]
    wait_for(
        lambda: (s := status(info))["attempt"] == 2 and s["state"] == "exited",
        timeout=TORCH_START_S,
        what="attempt 2 runs to its end",
    )
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert f"resuming from {watched} at iter 10" in log
    # The trainer wrote where it is watched; the verified copy is what was verified, untouched.
    import torch

    assert torch.load(watched, weights_only=True)["iter_num"] == 30
    manifest = ck.read_manifest(copy10.parent)
    assert manifest is not None and digest_of(copy10) == manifest.digest
    assert torch.load(copy10, weights_only=True)["iter_num"] == 10
    # What the restore replaced is kept beside it, and said.
    assert (watched.parent / "ckpt.pt.before-resume").read_bytes() == torn
    notes = [
        r.message
        for r in journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, protocol.KeeperNote) and r.kind == "resume"
    ]
    assert any(f"restored {watched} from the verified copy {copy10}" in n for n in notes), notes
