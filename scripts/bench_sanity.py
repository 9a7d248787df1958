"""Per-step cost of what the keeper does for each Step frame (run by hand, not a test):
`Series.observe_step`, `SanityTracker.observe_step`, and `SanityTracker.findings` on a full
window; with --tracer, the forward overhead of NonFiniteTracer on a small CPU model.

    python scripts/bench_sanity.py [--points 200000] [--ranks 8] [--tracer]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from trainroom.core.health.sanity import SanityTracker
from trainroom.core.run.series import Series
from trainroom.core.wire.protocol import RequestedConfig


def bench_series(n: int) -> float:
    rng = random.Random(0)
    rows = [
        (i, i * 0.001, i * 4096, 2 + 8 * math.exp(-i / 3000) + rng.gauss(0, 0.05), [1e-4], 1.0 + rng.random())
        for i in range(n)
    ]
    s = Series()
    t0 = time.perf_counter()
    for step, t, tok, loss, lr, g in rows:
        s.observe_step(step, t=t, tokens=tok, loss=loss, lr=lr, grad_norm=g, loss_scale=65536.0)
    return (time.perf_counter() - t0) / n


def bench_tracker(n: int, ranks: int) -> tuple[float, float]:
    rng = random.Random(0)
    tr = SanityTracker()
    tr.start_attempt(RequestedConfig(lr=1e-4, vocab_size=50257), resumed=False, t=0.0)
    rows = [
        (
            i % ranks,
            i // ranks,
            i * 0.001,
            2 + 8 * math.exp(-i / 3000) + rng.gauss(0, 0.05),
            1.0 + rng.random(),
        )
        for i in range(n)
    ]
    t0 = time.perf_counter()
    for rank, step, t, loss, g in rows:
        tr.observe_step(
            rank, step, t, loss=loss, grad_norm=g, lrs=[1e-4], loss_scale=65536.0, tokens=step * 4096
        )
    per_step = (time.perf_counter() - t0) / n
    calls = 200
    t0 = time.perf_counter()
    for _ in range(calls):
        tr.findings(n * 0.001)
    return per_step, (time.perf_counter() - t0) / calls


def bench_tracer(iters: int) -> tuple[float, float]:
    import torch

    from trainroom.core.sdk.reporter import NullReporter
    from trainroom.core.sdk.tracer import NonFiniteTracer

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.LayerNorm(256)]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(64, 256)

    torch.set_num_threads(1)  # a shared machine: one thread, best of several rounds

    def run() -> float:
        with torch.no_grad():
            model(x)
            t0 = time.perf_counter()
            for _ in range(iters):
                model(x)
        return (time.perf_counter() - t0) / iters

    tracer = NonFiniteTracer(model, reporter=NullReporter(), enabled=False)
    off, on = math.inf, math.inf
    for _ in range(5):
        tracer.enabled = False
        off = min(off, run())
        tracer.enabled = True
        on = min(on, run())
    tracer.remove()
    return off, on


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", type=int, default=200_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--tracer", action="store_true")
    a = ap.parse_args()
    print(f"Series.observe_step:          {bench_series(a.points) * 1e6:7.2f} us/point")
    per_step, per_call = bench_tracker(a.points, a.ranks)
    print(f"SanityTracker.observe_step:   {per_step * 1e6:7.2f} us/step ({a.ranks} ranks)")
    print(f"SanityTracker.findings:       {per_call * 1e6:7.1f} us/call")
    if a.tracer:
        off, on = bench_tracer(200)
        print(
            f"forward, 24 modules, 1 CPU:     {off * 1e3:7.3f} ms off, {on * 1e3:.3f} ms with the tracer "
            f"(+{(on - off) / off:.0%})"
        )


if __name__ == "__main__":
    main()
