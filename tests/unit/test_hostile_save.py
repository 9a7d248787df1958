"""The trainer's own save of a state with shared references ("billion laughs": 30 levels of a list
holding the list below it twice, 2^30 paths to one tensor) sizes it once per container, at once,
and saves it: the pre-save size estimate never walks every path."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CODE = """
    import time, torch
    from trainroom.core.sdk.save import SAVE_OVERHEAD, estimate_bytes, save_checkpoint
    node = [torch.ones(4)]
    for _ in range(30):
        node = [node, node]
    state = {"model": {"w": torch.zeros(3, 3)}, "laughs": node}
    t0 = time.monotonic()
    need = estimate_bytes(state)
    assert need == 16 + 36 + SAVE_OVERHEAD + 128 * 2, need  # each storage and tensor once
    saved = save_checkpoint(state, 20, root=ROOT, promote_inline=False)
    print("ok", saved.step, round(time.monotonic() - t0, 3))
"""


def test_a_state_of_shared_references_is_sized_and_saved_at_once(tmp_path: Path) -> None:
    # A walk of every path would take hours; the subprocess bound only keeps a regression from
    # hanging the suite.
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CODE).replace("ROOT", repr(str(tmp_path / "ck")))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:2] == ["ok", "20"], out.stdout
