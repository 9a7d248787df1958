"""Save into quarantine, promote, `latest`: with real torch saves, real failures and real processes."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.ckpt_fixtures import nanogpt_checkpoint, small_state
from trainroom.core.ckpt import layout as ck
from trainroom.core.ckpt import promote as pm
from trainroom.core.ckpt import verify as v
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.rules import findings_for_report
from trainroom.core.ckpt.verifier import verify_in_subprocess
from trainroom.core.sdk import save as save
from trainroom.core.wire import protocol as p

TESTS = str(Path(__file__).resolve().parents[2])  # the repo root: `tests.support` imports
# The caller's path after it, so the trainer imports the same trainroom as the test.
PYTHONPATH = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))


def _listing(root: Path) -> list[str]:
    return sorted(str(x.relative_to(root)) for x in root.rglob("*"))


def test_save_promotes_and_points_latest(tmp_path: Path) -> None:
    state, _ = nanogpt_checkpoint()
    saved = save.save_checkpoint(state, 300, root=tmp_path)
    assert saved.state == "verified", saved.reason
    assert os.readlink(tmp_path / "latest") == "step-000300"
    f = tmp_path / "step-000300" / "step-000300.pt"
    assert saved.file == str(f) and ck.latest_checkpoint(tmp_path) == f
    manifest = json.loads((tmp_path / "step-000300" / "manifest.json").read_text())
    # The digest taken while writing is the digest of the bytes on disk.
    assert manifest["digest"] == saved.digest == digest_file(f)
    assert manifest["size_bytes"] == f.stat().st_size == saved.size_bytes
    assert manifest["report"]["arch"]["layers"] == 2 and manifest["step"] == 300
    assert _listing(tmp_path / ".quarantine") == []  # no candidate, sidecar or temp left
    # Re-verifying the promoted file finds its digest in the manifest beside it.
    rep = v.verify(f)
    assert rep.ok and rep.digest_ok is True


def test_env_root_and_missing_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ENV_ROOT, str(tmp_path / "ck"))
    assert save.save_checkpoint(small_state(1), 1).state == "verified"
    assert ck.latest_checkpoint() == tmp_path / "ck" / "step-000001" / "step-000001.pt"
    monkeypatch.delenv(ck.ENV_ROOT)
    with pytest.raises(ck.CheckpointError, match="TRAINROOM_CKPT_ROOT"):
        save.save_checkpoint(small_state(2), 2)


def test_truncated_candidate_stays_quarantined_and_latest_unchanged(tmp_path: Path) -> None:
    # Scenario 12: the file on disk is shorter than what was written (DrvFs did this).
    save.save_checkpoint(small_state(100), 100, root=tmp_path)
    saved = save.save_checkpoint(small_state(200), 200, root=tmp_path, promote_inline=False)
    cand = Path(saved.path)
    assert saved.state == "candidate" and cand.parent.name == ".quarantine"
    with open(cand, "r+b") as fh:
        fh.truncate(cand.stat().st_size // 2)
    report = v.verify(cand, pm.expected_for(tmp_path, candidate=cand))
    record = pm.settle(cand, report, tmp_path)
    assert record.state == "rejected" and record.reason.startswith("truncated")
    assert cand.exists() and (cand.parent / (cand.name + ".reason")).read_text().startswith("truncated")
    assert json.loads((cand.parent / (cand.name + ".verify.json")).read_text())["ok"] is False
    assert os.readlink(tmp_path / "latest") == "step-000100"
    assert not (tmp_path / "step-000200").exists()
    assert ck.Quarantine(tmp_path).rejected() == [cand] and ck.Quarantine(tmp_path).candidates() == []
    f = findings_for_report(report)[0]
    assert f.code == "CKPT_REJECTED" and "truncated" in f.message
    with pytest.raises(ck.CheckpointError):
        pm.promote(cand, report, tmp_path)


def test_keeper_flow_over_a_real_socket(tmp_path: Path) -> None:
    """Under a keeper the trainer only saves and announces; the keeper verifies and promotes."""
    sock_path = str(tmp_path / "k.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    server.settimeout(60)
    root = tmp_path / "ck"
    script = textwrap.dedent(f"""
        from trainroom.core import sdk
        from tests.support.ckpt_fixtures import small_state
        rep = sdk.connect(sock_path={sock_path!r})
        saved = sdk.save_checkpoint(small_state(5), 5, root={str(root)!r})
        print(saved.state, saved.path)
        rep.close()
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        conn, _ = server.accept()
        conn.settimeout(60)
        reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
        msgs: list[object] = []
        while chunk := conn.recv(65536):
            msgs += reader.feed(chunk)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        server.close()
    state, cand = out.split()
    assert state == "candidate"
    kinds = [type(m).__name__ for m in msgs if not isinstance(m, p.Heartbeat)]
    assert kinds == ["Hello", "Phase", "Checkpoint", "Phase", "Bye"]
    phases = [m for m in msgs if isinstance(m, p.Phase)]
    assert phases[0].name == "checkpoint-save" and phases[1].name == "train"
    frame = next(m for m in msgs if isinstance(m, p.Checkpoint))
    assert frame.path == cand and frame.step == 5 and frame.digest == digest_file(cand)
    assert frame.size_bytes == Path(cand).stat().st_size
    assert not (root / "latest").exists()
    # The keeper's half: verify in a subprocess (no torch here), then settle.
    report = verify_in_subprocess(cand, pm.expected_for(root, candidate=cand), timeout=120)
    assert report.digest_ok is True
    record = pm.settle(cand, report, root)
    assert record.state == "verified" and record.path == cand and record.digest == frame.digest
    assert record.report is not None and record.report.promoted_dir == str(root / "step-000005")
    assert ck.latest_checkpoint(root) == root / "step-000005" / "step-000005.pt"


def test_presave_check_refuses_before_writing(tmp_path: Path) -> None:
    save.save_checkpoint(small_state(1), 1, root=tmp_path)

    class Nearly:  # statvfs figures: 100 MB disk with 1 MB available
        f_frsize = f_bsize = 4096
        f_blocks = 25_600
        f_bfree = f_bavail = 256

    with pytest.raises(save.CheckpointWontFit) as ei:
        save.save_checkpoint(
            {"w": torch.zeros(1_000_000)}, 2, root=tmp_path, statvfs=lambda _: Nearly, reserve_bytes=0
        )
    assert ei.value.errno == errno.ENOSPC and "will not fit" in str(ei.value)
    assert _listing(tmp_path / ".quarantine") == []
    assert os.readlink(tmp_path / "latest") == "step-000001"


def _roomy_statvfs() -> str:
    return textwrap.dedent("""
        class Roomy:  # what the pre-save check is told, so the write itself meets the full disk
            f_frsize = f_bsize = 4096
            f_blocks = f_bfree = f_bavail = 10**9
    """)


def test_write_failure_midway_leaves_latest_intact(tmp_path: Path) -> None:
    """A write that fails half-way (EFBIG from a real RLIMIT_FSIZE) cleans up after itself."""
    root = tmp_path / "ck"
    script = _roomy_statvfs() + textwrap.dedent(f"""
        import errno, resource, signal, torch
        from trainroom.core import sdk as ck
        from tests.support.ckpt_fixtures import small_state
        ck.save_checkpoint(small_state(1), 1, root={str(root)!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            ck.save_checkpoint({{"w": torch.zeros(2_000_000)}}, 2, root={str(root)!r}, statvfs=lambda _: Roomy)
        except OSError as exc:
            print(errno.errorcode[exc.errno])
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "EFBIG", out.stderr
    assert _listing(root / ".quarantine") == []
    assert sorted(x.name for x in root.iterdir()) == [".quarantine", "latest", "step-000001"]
    assert v.verify(ck.latest_checkpoint(root)).ok


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a private tmpfs")
def test_enospc_during_save_leaves_latest_intact(tmp_path: Path) -> None:
    """Real ENOSPC: the root is a 3 MiB tmpfs in a private user+mount namespace; the report of
    what is left comes from inside (the tmpfs goes with the namespace)."""
    root = tmp_path / "small"
    root.mkdir()
    script = tmp_path / "fill.py"
    script.write_text(
        _roomy_statvfs()
        + textwrap.dedent(f"""
        import errno, json, os, torch
        from trainroom.core import sdk as ck
        from trainroom.core.ckpt import verify as v
        from tests.support.ckpt_fixtures import small_state
        root = {str(root)!r}
        ck.save_checkpoint(small_state(1), 1, root=root)
        out = {{}}
        try:  # the real statvfs: the pre-save check refuses
            ck.save_checkpoint({{"w": torch.zeros(2_000_000)}}, 2, root=root)
        except ck.CheckpointWontFit as exc:
            out["precheck"] = errno.errorcode[exc.errno]
        try:  # told there is room, the write meets the full disk
            ck.save_checkpoint({{"w": torch.zeros(2_000_000)}}, 2, root=root, statvfs=lambda _: Roomy)
        except OSError as exc:
            out["write"] = errno.errorcode[exc.errno]
        out["quarantine"] = sorted(os.listdir(os.path.join(root, ".quarantine")))
        out["root"] = sorted(os.listdir(root))
        out["latest"] = os.readlink(os.path.join(root, "latest"))
        out["latest_ok"] = v.verify(ck.latest_checkpoint(root)).ok
        print(json.dumps(out))
    """)
    )
    cmd = [
        "unshare",
        "-rm",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=3m tmpfs "{root}" && exec "{sys.executable}" "{script}"',
    ]
    res = subprocess.run(
        cmd, env={**os.environ, "PYTHONPATH": PYTHONPATH}, capture_output=True, text=True, timeout=120
    )
    if res.returncode != 0 and "mount" in res.stderr and not res.stdout:
        pytest.skip(f"no private tmpfs here: {res.stderr.strip()[:200]}")
    assert res.stdout, res.stderr
    out = json.loads(res.stdout)
    assert out == {
        "precheck": "ENOSPC",
        "write": "ENOSPC",
        "quarantine": [],
        "root": [".quarantine", "latest", "step-000001"],
        "latest": "step-000001",
        "latest_ok": True,
    }


def test_a_late_verdict_does_not_roll_latest_back(tmp_path: Path) -> None:
    a = save.save_checkpoint(small_state(1), 1, root=tmp_path, promote_inline=False)
    b = save.save_checkpoint(small_state(2), 2, root=tmp_path, promote_inline=False)
    pm.settle(b.path, v.verify(b.path), tmp_path)
    assert os.readlink(tmp_path / "latest") == "step-000002"
    assert pm.settle(a.path, v.verify(a.path), tmp_path).state == "verified"
    assert os.readlink(tmp_path / "latest") == "step-000002"
    assert [c.step for c in ck.verified_checkpoints(tmp_path)] == [1, 2]


def test_same_step_saved_twice_gets_its_own_dir(tmp_path: Path) -> None:
    save.save_checkpoint(small_state(1), 7, root=tmp_path)
    save.save_checkpoint(small_state(2), 7, root=tmp_path)
    assert sorted(x.name for x in tmp_path.iterdir() if x.name.startswith("step")) == [
        "step-000007",
        "step-000007-2",
    ]
    assert os.readlink(tmp_path / "latest") == "step-000007-2"


def test_sweep_tidies_what_a_killed_writer_left(tmp_path: Path) -> None:
    save.save_checkpoint(small_state(1), 1, root=tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    q = ck.Quarantine(tmp_path)
    # A promotion killed after its manifest, before the rename: finished.
    saved = save.save_checkpoint(small_state(4), 4, root=tmp_path, promote_inline=False)
    report = v.verify(saved.path)
    target = pm.promote(saved.path, report, tmp_path)
    os.rename(target, tmp_path / f".promote-step-000004.{dead.pid}")
    ck.replace_latest(tmp_path, "step-000001")
    # A save killed while writing.
    (q.dir / f".step-000002.pt.{dead.pid}.tmp").write_bytes(b"half a checkpoint")
    # A promotion killed after moving the file, before its manifest: undone.
    half = tmp_path / f".promote-step-000003.{dead.pid}"
    half.mkdir()
    torch.save(small_state(3), half / "step-000003.pt")
    done = q.sweep()
    assert len(done) == 3, done
    assert [x.name for x in q.candidates()] == ["step-000003.pt"]
    assert not any(x.name.startswith(".") for x in tmp_path.iterdir() if x.name != ".quarantine")
    assert os.readlink(tmp_path / "latest") == "step-000004"


def test_latest_pointer_file_when_symlinks_are_unavailable(tmp_path: Path) -> None:
    save.save_checkpoint(small_state(1), 1, root=tmp_path)
    (tmp_path / "latest").unlink()
    (tmp_path / "latest").write_text("step-000001\n")
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step-000001" / "step-000001.pt"
    (tmp_path / "latest").write_text("../elsewhere\n")
    assert ck.latest_checkpoint(tmp_path) is None


def test_records_written_before_the_structs_still_read(tmp_path: Path) -> None:
    """A journal record whose report was a plain dict, and a manifest written by json.dump, as
    runs on disk have them: both decode into today's records."""
    import msgspec

    old = {
        "type": "ckpt",
        "path": "/r/.quarantine/step-000005.pt",
        "step": 5,
        "state": "verified",
        "t": 1.0,
        "report": {
            "ok": True,
            "format": "torch-zip",
            "tensors": 3,
            "nonfinite": {},
            "arch": {"layers": 2},
            "ram": {},
            "seconds": 0.01,
            "promoted_dir": "/r/step-000005",
            "promoted_file": "/r/step-000005/step-000005.pt",
        },
    }
    rec = p.record_decoder.decode(msgspec.msgpack.encode(old))
    assert isinstance(rec, p.CheckpointState) and rec.report is not None
    assert rec.report.promoted_file == "/r/step-000005/step-000005.pt" and rec.report.tensors == 3
    saved = save.save_checkpoint(small_state(5), 5, root=tmp_path)
    step_dir = tmp_path / "step-000005"
    f = step_dir / "step-000005.pt"
    manifest = {
        "version": 1,
        "ok": True,
        "file": f.name,
        "path": str(f),
        "step": 5,
        "size_bytes": f.stat().st_size,
        "digest": saved.digest,
        "digest_algo": "xxh3-128",
        "saved_at": 1.5,
        "verified_at": 2.5,
        "source": saved.path,
        "report": {
            "format": "torch-zip",
            "tensors": 2,
            "arch": {"layers": 1, "vocab": 64},
            "stds": {"a": 0.02},
        },
    }
    (step_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert ck.latest_checkpoint(tmp_path) == f
    (only,) = ck.verified_checkpoints(tmp_path)
    assert only.step == 5 and only.saved_at == 1.5 and only.digest == saved.digest
    prev = ck.previous_verified(tmp_path)
    assert prev is not None and prev.arch.vocab == 64 and prev.stds == {"a": 0.02}
    assert v.discover_expected(f).digest == saved.digest
    assert v.verify(f).digest_ok is True
