"""The demo's own evaluation: `python -m trainroom.core.demo.evaluate CKPT` loads a demo checkpoint
(through torch's safe loader), rebuilds the model from the architecture it records and prints its
mean loss on a fixed set of batches of the corpus as `eval_loss=X`. The batches come from a fixed
seed and torch runs on one thread, so the same checkpoint gives the same figure every time: what
`trainroom demo --eval` gates promotion by, and what `trainroom eval` reproduces."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

from trainroom.core.demo.model import CharGPT

EVAL_SEED = 1234


def checkpoint_file(path: str) -> Path:
    """A promoted checkpoint is a step directory holding one file; a candidate is the file."""
    p = Path(path)
    if p.is_dir():
        files = sorted(x for x in p.iterdir() if x.suffix in (".pt", ".pth", ".bin"))
        if not files:
            raise FileNotFoundError(f"no checkpoint file in {p}")
        return files[0]
    return p


def eval_loss(path: str, batches: int = 8, batch: int = 16) -> float:
    torch.set_num_threads(1)
    state = torch.load(checkpoint_file(path), map_location="cpu", weights_only=True)
    cfg = state["config"]
    ctx = int(cfg["ctx"])
    model = CharGPT(int(cfg["vocab"]), int(cfg["d_model"]), int(cfg["heads"]), int(cfg["layers"]), ctx)
    model.load_state_dict(state["model"])
    model.eval()
    text = resources.files("trainroom.core.demo").joinpath("corpus.txt").read_text()
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    gen = torch.Generator().manual_seed(EVAL_SEED)
    total = 0.0
    with torch.no_grad():
        for _ in range(batches):
            ix = torch.randint(len(data) - ctx - 1, (batch,), generator=gen)
            x = torch.stack([data[i : i + ctx] for i in ix])
            y = torch.stack([data[i + 1 : i + 1 + ctx] for i in ix])
            logits = model(x)
            total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)))
    return total / batches


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainroom-demo-eval", description=__doc__)
    ap.add_argument("checkpoint", help="a demo checkpoint file, or the step directory holding one")
    ap.add_argument("--batches", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        loss = eval_loss(args.checkpoint, batches=args.batches)
    except (OSError, KeyError, RuntimeError) as exc:
        print(f"trainroom-demo-eval: {args.checkpoint}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"eval_loss={loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
