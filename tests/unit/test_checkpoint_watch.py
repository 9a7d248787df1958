"""The watch on an uninstrumented trainer that overwrites out/ckpt.pt, as nanoGPT does: real files
written by torch.save, real stats, the pure poll driven with an explicit clock."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tests.support.ckpt_fixtures import nanogpt_checkpoint
from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt import promote as pm
from trainroom.core.ckpt import verify as v
from trainroom.core.ckpt import watch as w
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.report import failure_report


def write_ckpt(path: Path, iter_num: int) -> None:
    state, _ = nanogpt_checkpoint(iter_num=iter_num, seed=iter_num)
    torch.save(state, path)


def settle_and_request(state: w.WatchState, ckpt: Path, t0: float) -> tuple[w.WatchState, w.VerifyRequest]:
    """A new file: seen, settling, then (held still for SETTLE_S) one verify request."""
    project = ckpt.parent.parent
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], project), t0)
    assert reqs == [] and [(r.state, r.path) for r in recs] == [("candidate", str(ckpt))]
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], project), t0 + 1.0)
    assert reqs == [] and recs == []  # not stable for settle_s yet
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], project), t0 + w.SETTLE_S + 0.5)
    assert len(reqs) == 1 and [r.state for r in recs] == ["verifying"]
    return state, reqs[0]


def test_overwritten_file_is_verified_per_version_and_copied(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 100)
    state, req = settle_and_request(w.WatchState(), ckpt, 0.0)
    assert req.path == str(ckpt) and req.version == 1
    report = v.verify(req.path, req.expected)
    state, recs, stood = w.record_verdict(state, req, report, w.stat_one(req.path), 3.0)
    assert stood and [(r.state, r.step, r.digest) for r in recs] == [("verified", 100, digest_file(ckpt))]
    # Polling on finds nothing new to do.
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 10.0)
    assert reqs == [] and recs == []
    root = tmp_path / "ck"
    kept = pm.keep_verified_copy(ckpt, report, root)
    assert kept == root / "step-000100" and (kept / "ckpt.pt").read_bytes() == ckpt.read_bytes()
    assert ck.latest_checkpoint(root) == kept / "ckpt.pt"

    # nanoGPT writes the same path again at the next eval.
    write_ckpt(ckpt, 200)
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 1_000_000))
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 20.0)
    assert reqs == [] and [r.state for r in recs] == ["candidate"]
    state, reqs, recs = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 23.0)
    assert len(reqs) == 1 and reqs[0].version == 2
    # The previous version's fingerprint is what the new one is compared against.
    previous = reqs[0].expected.previous
    assert previous is not None and previous.arch.layers == 2
    report2 = v.verify(reqs[0].path, reqs[0].expected)
    state, recs, stood = w.record_verdict(state, reqs[0], report2, w.stat_one(str(ckpt)), 24.0)
    assert stood and recs[0].state == "verified" and recs[0].step == 200
    assert pm.keep_verified_copy(ckpt, report2, root) == root / "step-000200"
    assert os.readlink(root / "latest") == "step-000200"


def test_a_verdict_on_overwritten_bytes_is_dropped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 100)
    state, req = settle_and_request(w.WatchState(), ckpt, 0.0)
    report = v.verify(req.path)
    write_ckpt(ckpt, 101)  # overwritten while the verifier ran
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 1_000_000))
    state, recs, stood = w.record_verdict(state, req, report, w.stat_one(str(ckpt)), 3.0)
    assert not stood and recs == []
    assert state.files[str(ckpt)].state == "settling"
    # A copy of the old verdict's bytes cannot be made either: the file's digest no longer matches.
    assert pm.keep_verified_copy(ckpt, report, tmp_path / "ck") is None
    assert ck.Quarantine(tmp_path / "ck").candidates() == [] and not (tmp_path / "ck" / "latest").exists()


def test_truncated_version_raises_ckpt_rejected_until_replaced(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 100)
    with open(ckpt, "r+b") as f:
        f.truncate(ckpt.stat().st_size // 3)
    state, req = settle_and_request(w.WatchState(), ckpt, 0.0)
    report = v.verify(req.path)
    state, recs, stood = w.record_verdict(state, req, report, w.stat_one(str(ckpt)), 3.0)
    assert stood and recs[0].state == "rejected" and recs[0].reason.startswith("truncated")
    found = w.watch_findings(state)
    assert [f.code for f in found] == ["CKPT_REJECTED"] and found[0].key == str(ckpt)
    assert "quarantine" not in found[0].message  # the trainer's own file is left where it is
    write_ckpt(ckpt, 101)
    state, _, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 10.0)
    assert w.watch_findings(state) == []
    ckpt.unlink()
    state, _, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 11.0)
    assert state.files == {}


def test_deferred_verdict_retries_the_same_version(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 100)
    state, req = settle_and_request(w.WatchState(), ckpt, 0.0)
    state, recs, stood = w.record_verdict(
        state, req, failure_report(ckpt, "verifier timed out", deferred=True), w.stat_one(str(ckpt)), 3.0
    )
    assert not stood and recs == [] and state.files[str(ckpt)].state == "settling"
    state, reqs, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 3.0 + w.SETTLE_S)
    assert len(reqs) == 1 and reqs[0].version == req.version


def _rewrite(ckpt: Path, iter_num: int, ns: int) -> None:
    write_ckpt(ckpt, iter_num)
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + ns))


def test_a_rejected_rewrite_is_labelled_by_its_version_and_step_not_the_verified_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 120)
    state, req = settle_and_request(w.WatchState(), ckpt, 0.0)
    state, recs, _ = w.record_verdict(state, req, v.verify(req.path), w.stat_one(req.path), 3.0)
    assert [(r.state, r.step) for r in recs] == [("verified", 120)]
    # The trainer writes ckpt.pt again at its step 137 and is cut short: a torn version.
    _rewrite(ckpt, 121, 1_000_000)
    with open(ckpt, "r+b") as f:
        f.truncate(ckpt.stat().st_size // 3)
    state, _, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 10.0, step=137)
    state, reqs, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 13.0, step=140)
    state, recs, stood = w.record_verdict(state, reqs[0], v.verify(reqs[0].path), w.stat_one(str(ckpt)), 14.0)
    assert stood and [(r.state, r.step) for r in recs] == [("rejected", 137)]  # not "step 120 rejected"
    assert recs[0].reason is not None and recs[0].reason.startswith(
        "version 2 of ckpt.pt, step ~137 (its own step unreadable: the trainer's when it was written), "
        "after step 120 verified: truncated"
    )
    [found] = w.watch_findings(state)
    assert found.code == "CKPT_REJECTED" and "version 2 of ckpt.pt, step ~137" in found.message
    assert found.evidence["version"] == 2 and found.evidence["written_near_step"] == 137
    assert found.evidence["last_verified_step"] == 120 and "step" not in found.evidence


def test_versions_rewritten_before_they_settle_are_counted_and_said(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ckpt = out / "ckpt.pt"
    write_ckpt(ckpt, 10)
    state, _, _ = w.poll(w.WatchState(), w.sight(["out/ckpt*.pt"], tmp_path), 0.0)
    # Rewritten each second (settle_s is 2 s): none of these held still long enough.
    for i in range(1, 5):
        _rewrite(ckpt, 10 + i, i * 1_000_000)
        state, reqs, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), float(i))
        assert reqs == []
    # A write seen growing (same inode, more bytes) is the same version, not another.
    with open(ckpt, "ab") as f:
        f.write(b"\0" * 16)
    state, reqs, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 5.0)
    f0 = state.files[str(ckpt)]
    assert (f0.unverified, f0.seen) == (4, 5)
    state, reqs, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 5.0 + w.SETTLE_S)
    assert len(reqs) == 1
    state, said = w.unverified_note(state, str(ckpt))
    assert said == (
        f"{ckpt}: 4 more versions never verified (rewritten before they held still for 2 s, or while "
        "being verified); 0 of at least 5 versions seen were verified or rejected, 4 never: the trainer "
        "rewrites it faster than it can be checked"
    )
    assert w.unverified_note(state, str(ckpt))[1] is None  # said once
    # Rewritten while it was being verified: that version is never verified either.
    _rewrite(ckpt, 20, 9_000_000)
    state, _, _ = w.poll(state, w.sight(["out/ckpt*.pt"], tmp_path), 9.0)
    assert state.files[str(ckpt)].unverified == 5
    assert "1 more version never verified" in (w.unverified_note(state, str(ckpt))[1] or "")
