"""Replay beside a live run never touches it: a trainer that ignores the replay request trains from
scratch, saves through `save_checkpoint` into the root its own command line names (the run's) and
writes a file of its own into the run's working directory with plain `torch.save`. Replayed while
the run still trains (held after its spike), every file of the run's checkpoint root, `latest` and
the trainer's own file are bit for bit as they were; the replay's saves are in its scratch root and
its own file in its scratch directory. A replay that would share the run's GPU when its free memory
cannot take a second copy of the trainer (NVML's figures, from the fake driver) is refused with the
figures; on the CPU it runs. Once the run has ended, a replay's own file still never reaches the
run's working directory."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.journal.file import read_journal
from trainroom.core.run import store as runs
from trainroom.core.run.launch import launch
from trainroom.core.wire import protocol as p

TRAINER = Path(__file__).resolve().parents[1] / "support" / "trainers" / "ignores_replay.py"
TORCH_START_S = 240
GIB = 1 << 30


def _digests(top: Path) -> dict[str, Any]:
    """Every file under `top` by its digest, every link by its target."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            f = Path(dirpath, name)
            rel = str(f.relative_to(top))
            if f.is_symlink():
                out[rel] = "-> " + os.readlink(f)
            elif f.is_file():
                out[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _scenario(path: Path, used: int, procs: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    dev = {"name": "NVIDIA H100 80GB HBM3", "total_bytes": 80 * GIB, "used_bytes": used}
    tmp.write_text(json.dumps({"devices": [dev], "processes": procs}))
    os.replace(tmp, path)


def test_a_replay_beside_the_live_run_never_moves_its_checkpoints_or_files(
    trhome: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpts"
    hold = tmp_path / "hold"
    nvml = tmp_path / "nvml.json"
    _scenario(nvml, 1 * GIB, [])
    monkeypatch.setenv("TRAINROOM_FAKE_NVML", str(nvml))  # the keeper's driver view
    argv = [sys.executable, str(TRAINER), "--root", str(root), "--steps", "40", "--hold", str(hold)]
    info = launch(
        [*argv, "--own", "own/model.pt"], {"ckpt_root": str(root), "linger_s": 600}, cwd=str(tmp_path)
    )

    def held() -> dict[str, Any] | None:
        d = status(info)
        verified = sorted(c["step"] for c in d["checkpoints"] if c["state"] == "verified")
        spiked = any(f["code"] == "LOSS_SPIKE" for f in d["findings"])
        return d if spiked and verified == [10, 20] and d["ended_s_ago"] is None else None

    d = wait_for(
        held, timeout=TORCH_START_S, what="the spike at 25 seen, steps 10 and 20 verified, still training"
    )
    pid = d["pid"]
    before = {"root": _digests(root), "own": _digests(tmp_path / "own")}
    assert before["root"]["latest"].endswith("step-000020") and before["own"], before

    # The run's GPU (the driver's view): 70 of 80 GiB used, 60 of them its trainer's.
    _scenario(nvml, 70 * GIB, [{"pid": pid, "used_bytes": 60 * GIB, "device": 0}])
    wait_for(
        lambda: status(info)["vram"]["driver_run_bytes"] == 60 * GIB or None,
        timeout=60,
        what="the keeper sees its trainer's 60 GiB on GPU 0",
    )
    out = run_cli("replay", info.run_id, "--step", "25", timeout=TORCH_START_S)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert out.stderr.strip().splitlines() == [
        f"trainroom: error: run {info.run_id} is still training (attempt 1, trainer pid {pid}, its keeper "
        "alive): the replay would share GPU 0 with the live trainer and its memory does not allow it: "
        "10.0 GiB free of 80.0 GiB, and the run's trainer holds 60.0 GiB there (what a replay of the same "
        "command needs): replay on the CPU (--device cpu), on another GPU (--device N), or once the run "
        "has ended"
    ], out.stderr
    assert not (Path(info.run_dir) / "replays").exists() or not any(
        (Path(info.run_dir) / "replays").iterdir()
    )

    out = run_cli("replay", info.run_id, "--step", "25", "--device", "cpu", timeout=TORCH_START_S)
    # It trained 40 steps from scratch beside the live run and printed no replay_loss: one line, exit 2.
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout + out.stderr
    assert "printed no replay_loss=" in out.stderr, out.stderr
    assert {"root": _digests(root), "own": _digests(tmp_path / "own")} == before
    assert status(info)["ended_s_ago"] is None  # held, still the live attempt
    (scratch,) = list((Path(info.run_dir) / "replays").iterdir())
    saved = sorted(f.name for f in (scratch / "checkpoints").iterdir() if f.name.startswith("step-"))
    assert saved == ["step-000010", "step-000020", "step-000030", "step-000040"], saved
    assert (scratch / "written" / "upper" / "0" / "own" / "model.pt").is_file()

    hold.touch()

    def done() -> dict[str, Any] | None:
        d = status(info)
        verified = [c for c in d["checkpoints"] if c["state"] == "verified"]
        return d if d["state"] == "exited" and len(verified) == 4 else None

    d = wait_for(done, timeout=TORCH_START_S, what="the run ended with its own 4 checkpoints verified")
    # Only the run's own saves were promoted: each verified checkpoint is one the live trainer made.
    raised = [
        r.finding.code
        for r in read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, p.FindingRaised)
    ]
    assert "DUPLICATE_TRAINER" not in raised, raised  # the replay is no second trainer of the run
    assert os.readlink(root / "latest").endswith("step-000040")

    # Ended: the same replay, on the device the run used; its own file still never reaches the cwd.
    ended = {"root": _digests(root), "own": _digests(tmp_path / "own")}
    out = run_cli("replay", info.run_id, "--step", "25", timeout=TORCH_START_S)
    assert out.returncode == 2 and "printed no replay_loss=" in out.stderr, out.stdout + out.stderr
    assert {"root": _digests(root), "own": _digests(tmp_path / "own")} == ended
    assert len(list((Path(info.run_dir) / "replays").iterdir())) == 2
