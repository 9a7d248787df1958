"""A trainer that rewrites its own out/ckpt.pt in place (nanoGPT's habit), watched under a real
keeper: versions rewritten faster than they can settle are counted and said, and a torn rewrite
after a verified one is labelled by its own version and step, never as the verified step
rejected. The trainer is a torch-free pickle writer (the verifier reads it as nanoGPT-like state)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.helpers import status
from tests.support.waiting import wait_for
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol

START_S = 240.0  # the keeper, the trainer and the verifier's first start on a loaded 2-core machine

REWRITER = """
import os, pickle, time
os.makedirs("out", exist_ok=True)
it = 0

def steps(n, dt):
    global it
    for _ in range(n):
        it += 1
        print(f"iter {it}: loss {4.0 - it / 100:.4f}, time 10.00ms", flush=True)
        time.sleep(dt)

def save(torn=False):
    data = pickle.dumps({"model": {"wte": [0.1] * 8}, "optimizer": {}, "iter_num": it})
    with open("out/ckpt.pt", "wb") as f:
        f.write(data[: len(data) // 3] if torn else data)

for _ in range(8):  # rewritten every ~0.4 s: none holds still for the 2 s it must
    steps(4, 0.1)
    save()
while not os.path.exists("go"):  # held still: the version of iter 32 verifies
    steps(1, 0.1)
steps(5, 0.05)
save(torn=True)  # cut short: its step cannot be read
while not os.path.exists("stop"):
    steps(1, 0.1)
"""


def test_a_rewritten_ckpt_counts_the_versions_never_verified_and_labels_a_torn_one(
    trhome: Path, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(REWRITER)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainroom.cli",
            "launch",
            "--watch-ckpt",
            "out/ckpt.pt",
            "--",
            sys.executable,
            "train.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    info = runs.resolve_run(out.stdout.strip())
    ckpt = str(tmp_path / "out" / "ckpt.pt")

    def row(s: dict[str, Any]) -> dict[str, Any] | None:
        return next((c for c in s["checkpoints"] if c["path"] == ckpt), None)

    wait_for(
        lambda: (c := row(status(info))) is not None and (c["state"], c["step"]) == ("verified", 32),
        timeout=START_S,
        what="the version of iter 32 verified",
    )
    notes = [
        r.message
        for r in journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME)
        if isinstance(r, protocol.KeeperNote) and "never verified" in r.message
    ]
    assert len(notes) == 1 and notes[0].startswith(f"{ckpt}: "), notes
    assert "rewrites it faster than it can be checked" in notes[0]
    (tmp_path / "go").touch()

    def rejected() -> dict[str, Any] | None:
        s = status(info)
        f = next((f for f in s["findings"] if f["code"] == "CKPT_REJECTED"), None)
        return s if f is not None else None

    s = wait_for(rejected, timeout=START_S, what="CKPT_REJECTED for the torn version")
    c = row(s)
    assert c is not None and c["state"] == "rejected" and c["step"] is not None and c["step"] > 32, c
    f = next(f for f in s["findings"] if f["code"] == "CKPT_REJECTED")
    assert f"step ~{c['step']}" in f["message"] and "after step 32 verified" in f["message"], f["message"]
    assert f["evidence"]["last_verified_step"] == 32 and f["evidence"]["version"] >= 2
    (tmp_path / "stop").touch()
    d = wait_for(lambda: (x := status(info))["state"] == "exited" and x, timeout=60, what="the trainer exits")
    assert d["exit"]["code"] == 0
