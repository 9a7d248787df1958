"""Checkpoints end to end (scenarios 5 on verify, 11, 12): a real keeper, a real trainer (the demo,
or an uninstrumented nanoGPT-shaped one), real files, the keeper's verify and prune actions and
the `trainroom verify` / `trainroom prune` verbs through the keeper and, once it is gone, on the
files."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import codes, run_cli, start_demo, status
from tests.support.waiting import wait_for
from trainroom.core.ckpt import layout as ck
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.run.client import KeeperClient
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol

NANOGPT_LIKE = Path(__file__).parents[1] / "support" / "nanogpt_like.py"
TORCH_START_S = 120  # a loaded 2-core machine: importing torch in trainer and verifier


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _root(info: runs.RunInfo) -> Path:
    return runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)


def _settled(d: dict[str, Any], n: int) -> bool:
    """The trainer ended, its `n` checkpoints all have a verdict, and the keeper's disk probe
    (once a second) has seen the newest verified one as `latest`."""
    done = [c for c in d["checkpoints"] if c["state"] in ("verified", "rejected")]
    verified = [c["promoted"] for c in done if c["state"] == "verified" and c["promoted"]]
    # ... and the next 0.1 s evaluation has raised CKPT_REJECTED for each rejection.
    said = {f["evidence"].get("path") for f in d["findings"] if f["code"] == "CKPT_REJECTED"}
    return (
        d["state"] in ("exited", "dead")
        and len(done) >= n
        and (not verified or d["latest_checkpoint"] == max(verified))
        and all(c["path"] in said for c in done if c["state"] == "rejected")
    )


def _step_dirs(root: Path) -> list[str]:
    return sorted(x.name for x in root.iterdir() if x.name.startswith("step-") and x.is_dir())


def _stop_keeper(info: runs.RunInfo) -> None:
    rec = runs.read_record(Path(info.run_dir))
    assert rec.keeper_pid
    os.kill(rec.keeper_pid, signal.SIGTERM)
    wait_for(lambda: not runs.resolve_run(info.run_id).alive, timeout=30, what="keeper gone")


def test_demo_checkpoints_verified_promoted_and_pruned_through_the_keeper_then_on_files(trhome: Path) -> None:
    info = start_demo(steps=30, ckpt_every=10, step_delay=0.01)
    d = wait_for(lambda: _settled(s := status(info), 3) and s, timeout=TORCH_START_S, what="3 verdicts")
    assert [(c["step"], c["state"]) for c in d["checkpoints"]] == [
        (10, "verified"),
        (20, "verified"),
        (30, "verified"),
    ]
    root = _root(info)
    # The trainer saved where the keeper looks (the keeper exported the root), one root per run.
    assert root == Path(info.run_dir) / "checkpoints"
    assert _step_dirs(root) == ["step-000010", "step-000020", "step-000030"]
    assert os.readlink(root / ck.LATEST) == "step-000030"
    assert d["latest_checkpoint"] == str(root / "step-000030" / "step-000030.pt")
    assert d["checkpoints"][-1]["promoted"] == d["latest_checkpoint"]
    assert not list((root / ck.QUARANTINE).glob("*.pt"))  # promoted means moved out of quarantine
    manifest = json.loads((root / "step-000030" / ck.MANIFEST).read_text())
    assert manifest["ok"] and manifest["digest"] == d["checkpoints"][-1]["digest"]
    assert manifest["report"]["arch"]["layers"] == 2 and manifest["report"]["arch"]["d_model"] == 64

    # The keeper's verify action on `latest`: digest against the manifest, tensors, arch.
    r = KeeperClient(info.sock).confirmed("verify", {})
    assert r.ok, r.message
    assert r.after["path"] == d["latest_checkpoint"] and r.after["digest_ok"] is True
    assert r.after["tensors"] > 0 and r.after["nonfinite"] == {} and r.after["arch_mismatch"] == []
    # `trainroom verify RUN` goes through the same keeper (journaled), exit 0.
    out = run_cli("verify", info.run_id, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["path"] == d["latest_checkpoint"]
    verifies = [a for a in _journal(info) if isinstance(a, protocol.ActionRecord) and a.action == "verify"]
    assert len(verifies) == 2 and all(a.ok for a in verifies)

    # `trainroom prune RUN` while the keeper is up: through it, journaled with the bytes freed.
    out = run_cli("prune", info.run_id, "--keep", "2")
    assert out.returncode == 2 and "--yes" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("prune", info.run_id, "--keep", "2", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["via"] == "keeper" and [t["step"] for t in res["deleted"]] == [10] and res["bytes_freed"] > 0
    assert _step_dirs(root) == ["step-000020", "step-000030"]
    prunes = [a for a in _journal(info) if isinstance(a, protocol.ActionRecord) and a.action == "prune"]
    assert len(prunes) == 1 and prunes[0].ok and prunes[0].after["bytes_freed"] == res["bytes_freed"]
    d = wait_for(
        lambda: (s := status(info))["checkpoints"][0]["state"] == "pruned" and s,
        timeout=10,
        what="pruned state",
    )
    assert [c["state"] for c in d["checkpoints"]] == ["pruned", "verified", "verified"]

    # The keeper gone: the same verbs work on the files the run record names.
    _stop_keeper(info)
    out = run_cli("verify", info.run_id)
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout and "digest matches" in out.stdout
    out = run_cli("prune", info.run_id, "--keep", "1", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["via"] == "files" and [t["step"] for t in res["deleted"]] == [20]
    assert _step_dirs(root) == ["step-000030"] and os.readlink(root / ck.LATEST) == "step-000030"


def test_truncated_checkpoint_rejected_stays_in_quarantine_latest_unchanged_and_drvfs_said(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The keeper reads mounts under its proc root: stage WSL's, with the state dir on DrvFs (9p).
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mounts").write_text(
        "/dev/sdc / ext4 rw,relatime 0 0\n"
        f"C:\\134 {trhome} 9p rw,noatime,dirsync,aname=drvfs;path=C:\\;uid=0 0 0\n"
    )
    monkeypatch.setenv("TRAINROOM_PROC_ROOT", str(proc))
    info = start_demo(fault="truncated-ckpt", fault_step=20, steps=30, ckpt_every=10, step_delay=0.01)
    d = wait_for(lambda: _settled(s := status(info), 3) and s, timeout=TORCH_START_S, what="3 verdicts")
    states = {c["step"]: c for c in d["checkpoints"]}
    assert states[10]["state"] == "verified"
    for step in (20, 30):
        assert states[step]["state"] == "rejected" and states[step]["reason"].startswith("truncated")
    root = _root(info)
    q = root / ck.QUARANTINE
    for step in (20, 30):
        cand = q / f"step-{step:06d}.pt"
        assert cand.is_file()  # kept, as evidence
        assert Path(str(cand) + ck.REASON_SUFFIX).read_text().startswith("truncated")
    # `latest` never moved off the last checkpoint that verified.
    assert os.readlink(root / ck.LATEST) == "step-000010" and _step_dirs(root) == ["step-000010"]
    assert d["latest_checkpoint"] == str(root / "step-000010" / "step-000010.pt")
    rejected = [f for f in d["findings"] if f["code"] == "CKPT_REJECTED"]
    assert len(rejected) == 2 and all(
        f["severity"] == "critical" and f["action"] == "verify" for f in rejected
    )
    assert all("truncated" in f["message"] and "stays in quarantine" in f["message"] for f in rejected)
    assert {f["evidence"]["step"] for f in rejected} == {20, 30}
    # The verifier says the same from the command line (exit 1: rejected).
    out = run_cli("verify", str(q / "step-000020.pt"), "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["reason"].startswith("truncated")
    drvfs = next(f for f in d["findings"] if f["code"] == "DRVFS_CHECKPOINTS")
    assert drvfs["evidence"]["fstype"] == "9p" and drvfs["evidence"]["mountpoint"] == str(trhome)
    assert "native Linux directory" in drvfs["message"]


def test_exploded_weights_rejected_on_verify_naming_the_tensor(trhome: Path) -> None:
    # Scenario 5 on verify: the run starts from weights whose lm_head std is 13.87 (a
    # "best" checkpoint); the checkpoint it saves carries them and must not become `latest`.
    info = start_demo(fault="exploded-init", steps=10, ckpt_every=10, step_delay=0.01)
    d = wait_for(lambda: _settled(s := status(info), 1) and s, timeout=TORCH_START_S, what="a verdict")
    (c,) = d["checkpoints"]
    assert c["state"] == "rejected" and c["reason"].startswith("exploded tensor: lm_head.weight std 1")
    assert d["latest_checkpoint"] is None and not (_root(info) / ck.LATEST).exists()
    f = next(f for f in d["findings"] if f["code"] == "CKPT_REJECTED")
    worst = f["evidence"]["outliers"][0]
    assert worst["name"] == "lm_head.weight" and worst["kind"] == "exploded" and worst["std"] > 10
    assert worst["median_std"] < 1  # the other matrices are healthy: one tensor, named
    out = run_cli("verify", c["path"])
    assert out.returncode == 1 and "exploded: lm_head.weight std 1" in out.stdout


def test_disk_fill_raises_disk_high_and_full_soon_then_prune_frees_space_keeping_n(trhome: Path) -> None:
    # The demo's disk-fill: a 160 MiB budget, a ~9.7 MB checkpoint every step. The SDK's pre-save
    # check refuses the checkpoint the budget cannot take; the trainer skips it and trains on.
    info = start_demo(fault="disk-fill", steps=40, step_delay=0.05)

    def filled(d: dict[str, Any]) -> bool:
        """The trainer ended, every checkpoint has a verdict, and the disk probe after them (once a
        second) has fed the disk guard: both findings up, with what a prune would free."""
        soon = [f for f in d["findings"] if f["code"] == "DISK_FULL_SOON"]
        return (
            _settled(d, 2)
            and all(c["state"] in ("verified", "rejected") for c in d["checkpoints"])
            and "DISK_HIGH" in codes(d)
            and bool(soon)
            and "prune would free" in soon[0]["message"]
        )

    d = wait_for(
        lambda: filled(s := status(info)) and s,
        timeout=TORCH_START_S,
        what="the trainer ended, verdicts in, DISK_HIGH and DISK_FULL_SOON up",
    )
    n_saved = len(d["checkpoints"])
    assert 10 <= n_saved < 40  # some fit, the rest were refused before a byte was written
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert log.count("skipped: checkpoint of") == 40 - n_saved and "budget" in log
    assert {"DISK_HIGH", "DISK_FULL_SOON"} <= codes(d)
    high = next(f for f in d["findings"] if f["code"] == "DISK_HIGH")
    assert high["action"] == "prune" and high["evidence"]["budget"] is True
    assert high["evidence"]["used_fraction"] >= 0.85 and high["evidence"]["free_bytes"] > 0
    soon = next(f for f in d["findings"] if f["code"] == "DISK_FULL_SOON")
    # The saves the trainer skipped are counted and named, and the steps at risk grow with them;
    # never "the next will not fit" once they are being skipped.
    steps = [int(m) for m in re.findall(r"checkpoint step (\d+) skipped", log)]
    first, last, ev = min(steps), max(steps), soon["evidence"]
    assert soon["severity"] == "critical" and "the next checkpoint will not fit" not in soon["message"]
    assert (ev["skipped"], ev["skipped_first"], ev["skipped_last"]) == (len(steps), first, last)
    last_ok = max(c["step"] for c in d["checkpoints"] if c["state"] == "verified")
    assert ev["last_verified_step"] == last_ok and ev["steps_at_risk"] == last - last_ok
    assert f"{len(steps)} saves skipped (steps {first}–{last}), they do not fit; " in soon["message"]
    assert (
        f"{last - last_ok} steps at risk since the last verified checkpoint (step {last_ok})"
        in soon["message"]
    )
    # The budget and the disk said apart.
    text = run_cli("status", info.run_id).stdout
    assert re.search(r"  budget \d+% used \(of 160 MiB\)  disk \d+% used", text), text
    assert soon["evidence"]["prunable_bytes"] > 0 and "prune would free" in soon["message"]
    # While the trainer was writing, DISK_FULL_SOON came with a time-to-full, before the budget was full.
    recs = _journal(info)
    raised = [
        r.finding
        for r in recs
        if isinstance(r, protocol.FindingRaised) and r.finding.code == "DISK_FULL_SOON"
    ]
    projected = [f for f in raised if f.evidence["saves_left"] > 0]
    assert (
        projected
        and projected[0].evidence["time_to_full_s"] > 0
        and "more fit; full in" in projected[0].message
    )
    last_save = max(
        r.t for r in recs if isinstance(r, protocol.Received) and isinstance(r.msg, protocol.Checkpoint)
    )
    assert projected[0].first_seen < last_save

    # The keeper's prune action: keeps the last 2 verified (latest among them), journals bytes freed.
    root = _root(info)
    newest = _step_dirs(root)[-2:]
    r = KeeperClient(info.sock).confirmed("prune", {"keep": 2})
    assert r.ok, r.message
    assert r.after["bytes_freed"] > 0 and len(r.after["deleted"]) == n_saved - 2
    assert r.after["disk_used_bytes"] < r.before["disk_used_bytes"]
    assert _step_dirs(root) == newest and os.readlink(root / ck.LATEST) == newest[-1]
    act = [a for a in _journal(info) if isinstance(a, protocol.ActionRecord) and a.action == "prune"]
    assert len(act) == 1 and act[0].after["bytes_freed"] == r.after["bytes_freed"]
    wait_for(
        lambda: not ({"DISK_HIGH", "DISK_FULL_SOON"} & codes(status(info))),
        timeout=30,
        what="disk findings cleared",
    )
    wait_for(lambda: status(info)["disk"]["used_fraction"] < 0.85, timeout=30, what="the next disk probe")
    cleared = {r.ident for r in _journal(info) if isinstance(r, protocol.FindingCleared)}
    assert {i.split(":")[0] for i in cleared} >= {"DISK_HIGH", "DISK_FULL_SOON"}


def test_watched_nanogpt_checkpoint_each_version_verified_and_a_verified_copy_kept(
    trhome: Path, tmp_path: Path
) -> None:
    work = tmp_path / "nanogpt"
    work.mkdir()
    info = launch(
        [sys.executable, str(NANOGPT_LIKE), "--iters", "20", "--save-every", "10", "--wait-copies"],
        {"watch_ckpt": ["out/*.pt"], "keep_verified_copies": True},
        cwd=str(work),
    )
    watched = str(work / "out" / "ckpt.pt")

    def ended(d: dict[str, Any]) -> bool:
        # The trainer waits for each copy before going on; the disk probe (once a second) then
        # shows the last copy as `latest`.
        latest = d["latest_checkpoint"] or ""
        return d["state"] == "dead" or (d["state"] == "exited" and latest.endswith("/step-000020/ckpt.pt"))

    d = wait_for(lambda: ended(s := status(info)) and s, timeout=TORCH_START_S + 60, what="trainer ended")
    assert d["state"] == "exited", (Path(info.run_dir) / runs.LOG_NAME).read_text()[-2000:]
    assert d["instrumented"] is False and d["step"] == 20  # nanoGPT's `iter N: loss X` lines
    recs = _journal(info)
    verdicts = [
        r
        for r in recs
        if isinstance(r, protocol.CheckpointState)
        and r.path == watched
        and r.state in ("verified", "rejected")
    ]
    # Each version of the overwritten file verified once, with its own digest and iter_num.
    assert [(r.state, r.step) for r in verdicts] == [("verified", 10), ("verified", 20)]
    assert len({r.digest for r in verdicts}) == 2
    root = _root(info)
    assert (
        _step_dirs(root) == ["step-000010", "step-000020"] and os.readlink(root / ck.LATEST) == "step-000020"
    )
    for step, r in zip((10, 20), verdicts, strict=True):
        man = json.loads((root / f"step-{step:06d}" / ck.MANIFEST).read_text())
        assert man["file"] == "ckpt.pt" and man["digest"] == r.digest and man["source"] == watched
        # nanoGPT's model_args matched the weights; the tied wte/lm_head counted once.
        arch = man["report"]["arch"]
        assert (arch["layers"], arch["d_model"], arch["vocab"]) == (2, 32, 65)
    assert d["latest_checkpoint"] == str(root / "step-000020" / "ckpt.pt")
    by_path = {c["path"]: c for c in d["checkpoints"]}
    assert by_path[watched]["state"] == "verified" and by_path[watched]["step"] == 20
    assert by_path[str(root / "step-000010" / "ckpt.pt")]["state"] == "verified"
    assert "CKPT_REJECTED" not in codes(d)
    # The keeper's verify action on `latest` (the kept copy): its digest is the one the watch took.
    r = KeeperClient(info.sock).confirmed("verify", {})
    assert r.ok, r.message
    assert r.after["digest"] == verdicts[-1].digest and r.after["digest_ok"] is True and r.after["step"] == 20
