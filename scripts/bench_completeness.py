"""What reading completeness costs a verification, per checkpoint format.

Each checkpoint is written by the real library (torch.save of a nanoGPT-shaped dict with AdamW
state, a Hugging Face Trainer's `checkpoint-N/`, a Lightning `.ckpt`, a torch.distributed.checkpoint
directory, a lone safetensors file) and verified in this process, `--trials` times with the
completeness read and as many without it (the reader replaced by one that returns nothing),
alternating so both see the same machine. Reported per format: the median verify time each way,
the time spent in the reader itself (timed around every call, summed per verify: the exact extra),
and that time over the verify without it. The claim is at most 5 % extra.

    python scripts/bench_completeness.py [--trials 9] [--layers 4] [--d-model 256]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))


def _nanogpt(out: Path, layers: int, d_model: int) -> Path:
    import torch
    import torch.nn.functional as F

    from tests.support.nanogpt_like import GPT

    torch.manual_seed(0)
    model = GPT(layers, 4, d_model, 64, 65)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4)
    x = torch.randint(65, (2, 64))
    F.cross_entropy(model(x).view(-1, 65), x.view(-1)).backward()
    opt.step()
    path = out / "ckpt.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "model_args": {"n_layer": layers, "n_embd": d_model, "vocab_size": 65},
            "iter_num": 1,
            "best_val_loss": torch.tensor(3.0),
            "config": {"learning_rate": 6e-4},
        },
        path,
    )
    return path


def _safetensors(out: Path, nanogpt: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    sd = torch.load(nanogpt, weights_only=True)["model"]
    sd = {k: v.contiguous().clone() for k, v in sd.items() if k != "transformer.wte.weight"}  # untied
    path = out / "model.safetensors"
    save_file(sd, str(path))
    return path


def _hf(out: Path) -> Path:
    from tests.support.ckpt_makers.hf_trainer import make_trainer

    make_trainer(str(out / "hf"), max_steps=2, save_steps=2).train()
    return out / "hf" / "checkpoint-2"


def _lightning(out: Path) -> Path:
    from tests.support.ckpt_makers.lightning_fit import fit

    fit(str(out / "lightning"), max_steps=2, every=2)
    return out / "lightning" / "step=2.ckpt"


def _dcp(out: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    from tests.support.ckpt_makers.dcp_save import small_state

    dcp.save(small_state(step=10), checkpoint_id=str(out / "dcp"))
    return out / "dcp"


class Timed:
    """The completeness reader, timed around each call (and, when off, replaced by nothing)."""

    def __init__(self) -> None:
        from trainroom.core.ckpt import completeness

        self.module = completeness
        self.real: Callable[..., Any] = completeness.safely
        self.spent = 0.0

    def safely(self, read: Any, *args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.real(read, *args, **kw)
        finally:
            self.spent += time.perf_counter() - t0

    @contextlib.contextmanager
    def mode(self, on: bool) -> Iterator[None]:
        self.module.safely = self.safely if on else (lambda *a, **k: None)  # type: ignore[assignment]
        try:
            yield
        finally:
            self.module.safely = self.real  # type: ignore[assignment]


def bench(path: Path, trials: int, timed: Timed) -> dict[str, float]:
    from trainroom.core.ckpt.verify import verify

    for on in (True, False):  # warm: imports, page cache
        with timed.mode(on):
            verify(path)
    with_s, without_s, reader_s = [], [], []
    for _ in range(trials):
        for on in (True, False):
            timed.spent = 0.0
            with timed.mode(on):
                t0 = time.perf_counter()
                rep = verify(path)
                dt = time.perf_counter() - t0
            assert rep.ok, rep.reason
            assert (rep.completeness is not None) == on, path
            (with_s if on else without_s).append(dt)
            if on:
                reader_s.append(timed.spent)
    w, wo, r = (statistics.median(x) for x in (with_s, without_s, reader_s))
    return {"with_s": w, "without_s": wo, "reader_s": r, "extra": r / wo}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=9)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    out = Path(tempfile.mkdtemp(prefix="bench-complete-"))
    try:
        nano = _nanogpt(out, a.layers, a.d_model)
        targets = {
            "torch.save dict (nanoGPT)": nano,
            "safetensors file": _safetensors(out, nano),
            "HF checkpoint-N/": _hf(out),
            "Lightning .ckpt": _lightning(out),
            "DCP directory": _dcp(out),
        }
        timed = Timed()
        print(f"{'checkpoint':28} {'verify':>10} {'without':>10} {'reader':>10} {'extra':>7}")
        worst = 0.0
        for name, path in targets.items():
            r = bench(path, a.trials, timed)
            worst = max(worst, r["extra"])
            print(
                f"{name:28} {r['with_s'] * 1e3:8.2f}ms {r['without_s'] * 1e3:8.2f}ms "
                f"{r['reader_s'] * 1e3:8.3f}ms {r['extra'] * 100:6.2f}%"
            )
        print(f"worst extra: {worst * 100:.2f}% ({'within' if worst <= 0.05 else 'OVER'} the 5 % bound)")
        return 0 if worst <= 0.05 else 1
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
