"""A real `torch.distributed.checkpoint` directory (`.metadata` + `__0_0.distcp`), written by
`dcp.save` of a small model's and optimizer's state in one process without a process group.

    python dcp_save.py OUT_DIR [--step N]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn


def small_state(seed: int = 0, step: int = 10) -> dict[str, Any]:
    """A model after one real AdamW step, its optimizer state, and the step."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 64, (4, 8))).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def save(out_dir: str, step: int = 10, seed: int = 0) -> None:
    dcp.save(small_state(seed, step), checkpoint_id=out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--step", type=int, default=10)
    a = ap.parse_args(argv)
    save(a.out_dir, a.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
