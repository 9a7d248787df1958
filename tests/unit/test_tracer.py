"""NonFiniteTracer on a real small model whose layer weights are set to inf / NaN (scenario 7)."""

from __future__ import annotations

import logging
import math
import os
import socket
import time

import pytest

from trainroom.core.health.sanity import SanityTracker
from trainroom.core.sdk.reporter import NullReporter, Reporter
from trainroom.core.sdk.tracer import INPUT, NonFiniteTracer
from trainroom.core.wire import protocol as p

torch = pytest.importorskip("torch")
nn = torch.nn

QUIET = NullReporter()


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Tiny(nn.Module):
    """Embedding, three residual blocks, a head: outputs a (logits, loss) tuple like many trainers."""

    def __init__(self, vocab: int = 50, d: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(3)])
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.head(x)
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 50, (2, 8), generator=g), torch.randint(0, 50, (2, 8), generator=g)


def hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("poison", [math.inf, math.nan], ids=["inf", "nan"])
def test_names_the_first_module_in_execution_order(poison: float) -> None:
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        model.blocks[1].mlp[2].weight[0, 0] = poison  # later modules all see it too
    tracer = NonFiniteTracer(model, reporter=QUIET)
    tracer.step = 41
    _, loss = model(*batch())
    assert not math.isfinite(loss.item())
    assert tracer.first == (41, "blocks.1.mlp.2")
    assert tracer.reports == 1


def test_a_healthy_forward_reports_nothing_and_training_still_works() -> None:
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with NonFiniteTracer(model, reporter=QUIET) as tracer:
        for _ in range(3):
            _, loss = model(*batch())
            opt.zero_grad()
            loss.backward()
            opt.step()
        assert math.isfinite(loss.item())
        assert tracer.first is None and tracer.reports == 0
        assert hooks(model) > 0
    assert hooks(model) == 0  # the context manager took every hook away


def test_reports_once_per_episode_and_rearms_after_a_clean_forward() -> None:
    torch.manual_seed(0)
    model = Tiny()
    tracer = NonFiniteTracer(model, reporter=QUIET)
    w = model.head.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w[3, 3] = math.inf
    for _ in range(3):
        model(*batch())
    assert tracer.reports == 1 and tracer.first == (None, "head")
    with torch.no_grad():
        w.copy_(saved)
    model(*batch())
    with torch.no_grad():
        model.embed.weight.fill_(math.nan)
    tracer.step = 7
    model(*batch())
    assert tracer.reports == 2 and tracer.first == (7, "embed")


def test_a_non_finite_input_batch_is_named_as_such() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    tracer = NonFiniteTracer(model, reporter=QUIET)
    model(torch.tensor([[1.0, math.nan, 0.0, 0.0]]))
    assert tracer.first == (None, INPUT)


def test_off_means_no_hooks_at_all() -> None:
    model = Tiny()
    tracer = NonFiniteTracer(model, reporter=QUIET, enabled=False)
    assert hooks(model) == 0 and not tracer.enabled
    with torch.no_grad():
        model.head.weight.fill_(math.inf)
    model(*batch())
    assert tracer.first is None
    tracer.enabled = True
    model(*batch())
    assert tracer.first == (None, "head")
    tracer.remove()
    assert hooks(model) == 0 and not tracer.enabled


def test_the_note_reaches_the_keeper_and_names_the_module_in_nonfinite(
    keeper_socket: tuple[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    path, srv = keeper_socket
    rep = Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=30.0)
    try:
        torch.manual_seed(0)
        model = Tiny()
        with torch.no_grad():
            model.blocks[0].norm.weight.fill_(math.inf)
        tracer = NonFiniteTracer(model, reporter=rep)
        tracer.step = 120
        with caplog.at_level(logging.WARNING, logger="trainroom.core.sdk.tracer"):
            _, loss = model(*batch())
        rep.step(120, loss=loss.item())
        rep.flush(timeout_s=2.0)
        conn, _ = srv.accept()
        conn.settimeout(0.2)
        reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
        got: list[object] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not any(isinstance(m, p.Step) for m in got):
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            got += reader.feed(data)
        conn.close()
    finally:
        rep.close()
    notes = [m for m in got if isinstance(m, p.Note)]
    assert [(n.kind, n.step, n.data) for n in notes] == [
        ("nonfinite-module", 120, {"module": "blocks.0.norm"})
    ]
    assert any("blocks.0.norm" in r.getMessage() for r in caplog.records)
    # What the keeper does with them: the NONFINITE finding names the module.
    tr = SanityTracker()
    tr.start_attempt(None, resumed=False, t=0.0)
    for m in got:
        if isinstance(m, p.Note):
            tr.observe_note(0, m.kind, m.step, m.data, m.t)
        elif isinstance(m, p.Step):
            tr.observe_step(0, m.step, m.t, loss=m.loss)
    f = next(f for f in tr.findings(time.time()) if f.code == "NONFINITE")
    assert f.evidence["module"] == "blocks.0.norm" and "blocks.0.norm" in f.message
