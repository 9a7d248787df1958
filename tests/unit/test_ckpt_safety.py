"""Promotion, sweep, prune and the state dir on real files, without a keeper: only the bytes
verified are promoted, a failed promotion is rolled back, a symlinked quarantine is refused,
prune keeps the newest checkpoint that still matches its digest, launch never chmods a state
dir it did not create. (tests/e2e/test_ckpt_safety.py does each through a real keeper.)"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import msgspec
import pytest

from trainroom.core.actions.resume import resume_lines
from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt import promote as pr
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.report import VerifyReport
from trainroom.core.ops import prune as pruning
from trainroom.core.ops.resume import ResumeInputs, ResumePlan, fall_back, plan_resume, resume_points
from trainroom.core.run import store as runs
from trainroom.core.run.parts import AttemptView
from trainroom.core.run.state import RunState


def _candidate(root: Path, step: int, data: bytes) -> tuple[Path, VerifyReport]:
    q = ck.Quarantine(root).ensure()
    cand = q / ck.candidate_name(step)
    cand.write_bytes(data)
    rep = VerifyReport(ok=True, path=str(cand), size_bytes=len(data), digest=digest_file(cand), step=step)
    return cand, rep


def _promoted(root: Path, step: int, data: bytes) -> Path:
    cand, rep = _candidate(root, step, data)
    return pr.promote(cand, rep, root)


def test_a_candidate_replaced_after_its_verdict_goes_back_to_be_verified_again(tmp_path: Path) -> None:
    cand, rep = _candidate(tmp_path, 10, b"good" * 100)
    swap = cand.with_name(".swap")
    swap.write_bytes(b"nan!" * 100)  # same size, other bytes
    os.replace(swap, cand)
    rec = pr.settle(cand, rep, tmp_path)
    assert rec.state == "candidate" and "changed since it was verified (digest differs)" in (rec.reason or "")
    assert cand.read_bytes() == b"nan!" * 100 and ck.Quarantine(tmp_path).candidates() == [cand]
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(("step-", ".promote-"))]
    assert ck.latest_dir(tmp_path) is None


def test_a_promotion_cut_by_a_full_disk_is_rolled_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _promoted(tmp_path, 10, b"a" * 64)
    cand, rep = _candidate(tmp_path, 20, b"b" * 64)

    def full(path: Path, record: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "write_json_atomic", full)
    with pytest.raises(OSError, match="No space"):
        pr.promote(cand, rep, tmp_path)
    assert cand.read_bytes() == b"b" * 64
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".promote-")]
    assert ck.latest_dir(tmp_path) == first
    monkeypatch.undo()
    assert pr.promote(cand, rep, tmp_path) == tmp_path / "step-000020"


def test_the_sweep_points_latest_at_the_newest_verified_when_it_points_nowhere(tmp_path: Path) -> None:
    _promoted(tmp_path, 10, b"a" * 64)
    _promoted(tmp_path, 20, b"b" * 64)
    (tmp_path / ck.LATEST).unlink()
    assert ck.Quarantine(tmp_path).sweep() == ["pointed latest at step-000020"]
    assert ck.latest_dir(tmp_path) == tmp_path / "step-000020"


def test_a_quarantine_that_is_a_symlink_is_refused_and_never_swept_through(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    victim = outside / ".x.pt.999999.tmp"
    victim.write_bytes(b"not ours")
    (root / ck.QUARANTINE).symlink_to(outside)
    q = ck.Quarantine(root)
    done = q.sweep()
    assert (
        victim.exists() and len(done) == 1 and done[0].startswith("refused: ") and "symbolic link" in done[0]
    )
    with pytest.raises(ck.CheckpointError, match="refusing the quarantine"):
        q.ensure()
    assert q.candidates() == [] and q.rejected() == []
    with pytest.raises(ck.CheckpointError):
        pr.keep_verified_copy(victim, VerifyReport(ok=True, digest=digest_file(victim)), root)
    assert sorted(x.name for x in outside.iterdir()) == [victim.name]


def test_prune_never_deletes_the_last_checkpoint_that_verifies_now(tmp_path: Path) -> None:
    good = _promoted(tmp_path, 10, b"a" * 64)
    bad = _promoted(tmp_path, 20, b"b" * 64)
    (bad / "step-000020.pt").write_bytes(b"n" * 64)  # `latest` replaced on disk, same size
    assert pr.intact(good) and not pr.intact(bad)
    # The once-a-second estimate does not read the bytes; prune itself does.
    assert [t.step for t in pruning.plan(tmp_path, 1, check_digests=False).delete] == [10]
    pl = pruning.plan(tmp_path, 1)
    assert pl.delete == [] and {k.step: k.why for k in pl.kept} == {20: "latest", 10: pruning.LAST_GOOD}
    # A stale plan: execute checks again before deleting.
    res = pruning.execute(pruning.plan(tmp_path, 1, check_digests=False))
    assert res.deleted == [] and [k.why for k in res.kept][-1] == pruning.LAST_GOOD and good.is_dir()


def test_an_existing_state_dir_keeps_its_mode_and_a_relative_one_is_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("TRAINROOM_HOME", str(shared))
    runs.ensure_runs_dir()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "runs").stat().st_mode) == 0o700
    assert "mode 1777" in (runs.state_dir_warning() or "")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINROOM_HOME", "new/home")
    runs.pin_home()
    assert os.environ["TRAINROOM_HOME"] == str(tmp_path / "new" / "home")
    runs.ensure_runs_dir()
    assert stat.S_IMODE((tmp_path / "new" / "home").stat().st_mode) == 0o700
    assert runs.state_dir_warning() is None


def _inputs(root: Path, template: str | None = "train --from {ckpt}") -> ResumeInputs:
    return ResumeInputs(
        run_id="r",
        argv=["train"],
        template=template,
        lock_files=(),
        ckpt_root=str(root),
        vram_tolerance_bytes=0,
        host_ram_floor_bytes=0,
    )


def test_a_resume_falls_back_from_a_latest_that_no_longer_verifies_and_says_so(tmp_path: Path) -> None:
    good = _promoted(tmp_path, 10, b"a" * 64) / "step-000010.pt"
    bad = _promoted(tmp_path, 20, b"b" * 64) / "step-000020.pt"
    state = RunState(run_id="r", argv=["train"], cwd=str(tmp_path), created=0.0)
    assert resume_points(str(tmp_path)) == [bad, good]
    plan = ResumePlan(attempt=2, checkpoint=str(bad), step=20)
    # The full verification of `bad` failed before the load: the next one that verifies.
    new = fall_back(plan, state, _inputs(tmp_path), {str(bad)})
    assert new is not None and new.checkpoint == str(good) and new.step == 10
    assert new.argv == ["train", "--from", str(good)] and f"{bad} did not verify" in new.note
    assert fall_back(plan, state, _inputs(tmp_path), {str(bad), str(good)}) is None
    # `latest` replaced on disk: the digest tells before any load.
    bad.write_bytes(b"n" * 64)
    again = fall_back(plan, state, _inputs(tmp_path), set())
    assert again is not None and again.checkpoint == str(good)


def test_a_verified_copy_is_restored_to_the_trainers_own_path(tmp_path: Path) -> None:
    own = tmp_path / "out" / "ckpt.pt"
    own.parent.mkdir()
    own.write_bytes(b"v1" * 32)
    rep = VerifyReport(ok=True, path=str(own), digest=digest_file(own), step=10)
    copy = pr.keep_verified_copy(own, rep, tmp_path / "root", step=10)
    assert copy is not None
    state = RunState(run_id="r", argv=["train"], cwd=str(tmp_path), created=0.0)
    new = fall_back(
        ResumePlan(attempt=2), state, _inputs(tmp_path / "root", "train --out_dir {ckpt_dir}"), set()
    )
    assert new is not None and new.checkpoint == str(own) and new.restore_from == str(copy / "ckpt.pt")
    assert new.argv == ["train", "--out_dir", str(own.parent)]
    # Unchanged: nothing to do. Torn: the verified bytes back, the torn ones kept beside.
    assert "holds the verified bytes already" in pr.restore_copy(copy / "ckpt.pt", own, rep.digest)
    own.write_bytes(b"to")
    said = pr.restore_copy(copy / "ckpt.pt", own, rep.digest)
    assert said.startswith("restored") and own.read_bytes() == b"v1" * 32
    assert (own.parent / "ckpt.pt.before-resume").read_bytes() == b"to"
    # The restored file verified again is the copy already kept: no second copy.
    assert pr.keep_verified_copy(own, rep, tmp_path / "root", step=10) == copy
    assert [c.step for c in ck.verified_checkpoints(tmp_path / "root")] == [10]


def test_the_resume_plan_shows_the_verified_copys_size_not_the_torn_files(tmp_path: Path) -> None:
    # The trainer died writing its own ckpt.pt (2 bytes left); the plan restores the verified copy
    # (64 bytes) there first: that is what the resume loads, its size is the one said and weighed.
    own = tmp_path / "out" / "ckpt.pt"
    own.parent.mkdir()
    own.write_bytes(b"v1" * 32)
    rep = VerifyReport(ok=True, path=str(own), digest=digest_file(own), step=10)
    copy = pr.keep_verified_copy(own, rep, tmp_path / "root", step=10)
    assert copy is not None
    own.write_bytes(b"to")
    state = RunState(run_id="r", argv=["train"], cwd=str(tmp_path), created=0.0)
    state.attempts.append(
        AttemptView(
            n=1, pid=10, pgid=4_000_000, start_time=0.0, started_at=0.0, argv=["t"], cwd="/", ended_at=5.0
        )
    )
    inputs = _inputs(tmp_path / "root", "train --out_dir {ckpt_dir}")
    plan = plan_resume(state, inputs, None)
    assert plan.checkpoint == str(own) and plan.restore_from == str(copy / "ckpt.pt")
    assert plan.checkpoint_bytes == 64
    assert "(64 B)" in resume_lines(plan)[0]
    new = fall_back(ResumePlan(attempt=2, checkpoint_bytes=2), state, inputs, set())
    assert new is not None and new.checkpoint_bytes == 64


def test_with_no_checkpoint_the_refusal_says_what_would_give_one_and_how_to_start_again(
    tmp_path: Path,
) -> None:
    state = RunState(run_id="r", argv=["python", "loop.py", "--lr", "3e-4"], cwd=str(tmp_path), created=0.0)
    state.attempts.append(
        AttemptView(
            n=1,
            pid=10,
            pgid=4_000_000,
            start_time=0.0,
            started_at=0.0,
            argv=["python", "loop.py", "--lr", "3e-4"],
            cwd="/",
            ended_at=5.0,
            attached=True,
        )
    )
    plan = plan_resume(state, _inputs(tmp_path / "root"), None)
    (why,) = plan.refusals
    assert why.startswith("no verified checkpoint: trainroom watched none of this attached trainer's saves")
    assert "`trainroom attach PID --ckpt DIR`" in why
    assert why.endswith("`trainroom launch -- python loop.py --lr 3e-4` starts it again from scratch")
    state.attempts[0] = msgspec.structs.replace(state.attempts[0], attached=False)
    (why,) = plan_resume(state, _inputs(tmp_path / "root"), None).refusals
    assert why.startswith("no verified checkpoint: `latest` points nowhere; `trainroom launch -- python")
