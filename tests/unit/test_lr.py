"""reimpose_lr against real torch optimizers and schedulers (scenario 4), and the argv parser."""

from __future__ import annotations

import logging
import os
import socket
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from trainroom.core.sdk.lr import reimpose_lr, requested_from_argv
from trainroom.core.sdk.reporter import NullReporter, Reporter
from trainroom.core.wire import protocol as p

torch = pytest.importorskip("torch")

QUIET = NullReporter()  # the SDK's own reporter outside a keeper, for tests not about reporting

sched = torch.optim.lr_scheduler


def session(lr: float, make: Callable[[Any, float], Any] | None = None) -> tuple[Any, Any]:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    return opt, (make or (lambda o, _lr: sched.StepLR(o, step_size=10, gamma=0.1)))(opt, lr)


def train(opt: Any, s: Any, n: int) -> list[float]:
    """n optimizer steps (no gradients: only the schedule moves); the LR in force after each."""
    out = []
    for _ in range(n):
        opt.step()
        s.step() if not isinstance(s, sched.ReduceLROnPlateau) else s.step(1.0)
        out.append(opt.param_groups[0]["lr"])
    return out


def checkpoint_of_old_run(
    make: Callable[[Any, float], Any] | None = None, lr: float = 1e-6, n: int = 5
) -> dict[str, Any]:
    opt, s = session(lr, make)
    train(opt, s, n)
    return {"optimizer": opt.state_dict(), "scheduler": s.state_dict()}


def resume(
    ckpt: dict[str, Any], lr: float, make: Callable[[Any, float], Any] | None = None
) -> tuple[Any, Any]:
    opt, s = session(lr, make)
    opt.load_state_dict(ckpt["optimizer"])
    s.load_state_dict(ckpt["scheduler"])
    return opt, s


# ---------------------------------------------------------------------------- scenario 4


def test_without_the_helper_the_checkpoint_run_lr_wins_1e6_then_1e7() -> None:
    opt, s = resume(checkpoint_of_old_run(), lr=1e-4)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-6)
    assert s.base_lrs == [pytest.approx(1e-6)]
    lrs = train(opt, s, 7)  # positions 6..12: the milestone at 10
    assert lrs[:4] == [pytest.approx(1e-6)] * 4
    assert lrs[4:] == [pytest.approx(1e-7)] * 3


def test_with_the_helper_the_session_schedule_holds() -> None:
    opt, s = resume(checkpoint_of_old_run(), lr=1e-4)
    changes = reimpose_lr(opt, s, 1e-4, reporter=QUIET)
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert train(opt, s, 7) == [pytest.approx(1e-4)] * 4 + [pytest.approx(1e-5)] * 3
    assert s.last_epoch == 12  # the position came from the checkpoint and stays
    by_field = {c.field: c for c in changes}
    for field in (
        "param_groups[0].lr",
        "param_groups[0].initial_lr",
        "scheduler.base_lrs[0]",
        "scheduler._last_lr[0]",
    ):
        assert by_field[field].old == pytest.approx(1e-6) and by_field[field].new == pytest.approx(1e-4)
    # A second call has nothing left to change.
    assert reimpose_lr(opt, s, 1e-4, reporter=QUIET) == []


# ---------------------------------------------------------------------------- the note reaches a keeper


def read_notes(srv: socket.socket, want: int = 1, timeout_s: float = 5.0) -> list[p.Note]:
    conn, _ = srv.accept()
    conn.settimeout(0.2)
    reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
    notes: list[p.Note] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(notes) < want and time.monotonic() < deadline:
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            notes += [m for m in reader.feed(data) if isinstance(m, p.Note)]
    finally:
        conn.close()
    return notes


def test_the_change_goes_to_the_keeper_and_the_log(
    keeper_socket: tuple[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    path, srv = keeper_socket
    rep = Reporter(path, p.Hello(pid=os.getpid()), heartbeat_s=30.0)
    try:
        opt, s = resume(checkpoint_of_old_run(), lr=1e-4)
        with caplog.at_level(logging.INFO, logger="trainroom.core.sdk.lr"):
            reimpose_lr(opt, s, 1e-4, reporter=rep, step=300)
        notes = read_notes(srv)
    finally:
        rep.close()
    assert len(notes) == 1
    note = notes[0]
    assert note.kind == "lr-reimposed" and note.step == 300
    assert note.data["groups"] == [{"group": 0, "old": pytest.approx(1e-6), "new": pytest.approx(1e-4)}]
    assert note.data["scheduler"] == "StepLR" and note.data["last_epoch"] == 5
    assert {c["field"] for c in note.data["changes"]} >= {
        "scheduler.base_lrs[0]",
        "param_groups[0].initial_lr",
    }
    assert "1e-06 -> 0.0001" in note.message
    assert any("LR re-imposed" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


# ---------------------------------------------------------------------------- every scheduler family

LR_OLD, LR_NEW, POSITION = 1e-6, 1e-4, 8

SCHEDULES: dict[str, Callable[[Any, float], Any]] = {
    "StepLR": lambda o, lr: sched.StepLR(o, step_size=4, gamma=0.5),
    "MultiStepLR": lambda o, lr: sched.MultiStepLR(o, milestones=[3, 11], gamma=0.3),
    "ExponentialLR": lambda o, lr: sched.ExponentialLR(o, gamma=0.9),
    "CosineAnnealingLR": lambda o, lr: sched.CosineAnnealingLR(o, T_max=20, eta_min=1e-8),
    "LinearLR": lambda o, lr: sched.LinearLR(o, start_factor=0.1, total_iters=12),
    "ConstantLR": lambda o, lr: sched.ConstantLR(o, factor=0.5, total_iters=10),
    "PolynomialLR": lambda o, lr: sched.PolynomialLR(o, total_iters=30, power=2.0),
    "LambdaLR": lambda o, lr: sched.LambdaLR(o, lambda e: min(1.0, (e + 1) / 12)),
    "MultiplicativeLR": lambda o, lr: sched.MultiplicativeLR(o, lambda e: 0.95),
    "OneCycleLR": lambda o, lr: sched.OneCycleLR(o, max_lr=lr, total_steps=40),
    "CyclicLR": lambda o, lr: sched.CyclicLR(o, base_lr=lr / 10, max_lr=lr, step_size_up=5),
    "CosineAnnealingWarmRestarts": lambda o, lr: sched.CosineAnnealingWarmRestarts(o, T_0=6),
    "SequentialLR": lambda o, lr: sched.SequentialLR(
        o,
        [sched.LinearLR(o, start_factor=0.1, total_iters=5), sched.CosineAnnealingLR(o, T_max=30)],
        milestones=[5],
    ),
    "ChainedScheduler": lambda o, lr: sched.ChainedScheduler(
        [sched.ExponentialLR(o, gamma=0.95), sched.StepLR(o, step_size=5, gamma=0.5)]
    ),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_resumed_session_follows_its_own_schedule(name: str) -> None:
    make = SCHEDULES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation chatter around these classes
        ckpt = checkpoint_of_old_run(make, lr=LR_OLD, n=POSITION)
        ref_opt, ref_s = session(LR_NEW, make)
        reference = train(ref_opt, ref_s, POSITION + 8)[POSITION - 1 :]
        opt, s = resume(ckpt, LR_NEW, make)
        assert opt.param_groups[0]["lr"] < reference[0] / 50  # the trap: the old run's LR is in force
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reimpose_lr(opt, s, LR_NEW, reporter=QUIET)
    assert not [w for w in caught if "get_last_lr" in str(w.message)]
    assert opt.param_groups[0]["lr"] == pytest.approx(reference[0], rel=1e-6)
    assert s.get_last_lr()[0] == pytest.approx(reference[0], rel=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert train(opt, s, 8) == pytest.approx(reference[1:], rel=1e-6)


def test_onecycle_keeps_its_div_factors() -> None:
    make = SCHEDULES["OneCycleLR"]
    opt, s = resume(checkpoint_of_old_run(make, lr=LR_OLD, n=POSITION), LR_NEW, make)
    reimpose_lr(opt, s, LR_NEW, reporter=QUIET)
    g = opt.param_groups[0]
    assert g["max_lr"] == pytest.approx(LR_NEW)
    assert g["initial_lr"] == pytest.approx(LR_NEW / 25)  # div_factor 25
    assert g["min_lr"] == pytest.approx(LR_NEW / 25 / 1e4)  # final_div_factor 1e4


def test_plateau_takes_the_request_and_keeps_its_floor() -> None:
    make = lambda o, lr: sched.ReduceLROnPlateau(o, factor=0.5, patience=0, min_lr=1e-9)  # noqa: E731
    opt, s = resume(checkpoint_of_old_run(make, lr=LR_OLD, n=4), LR_NEW, make)
    assert opt.param_groups[0]["lr"] < LR_OLD  # the old run's plateaus halved it
    reimpose_lr(opt, s, LR_NEW, reporter=QUIET)
    assert opt.param_groups[0]["lr"] == pytest.approx(LR_NEW) and s.min_lrs == [1e-9]
    assert s.get_last_lr() == [pytest.approx(LR_NEW)]


def test_no_scheduler_and_per_group_lrs() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    opt = torch.optim.AdamW(
        [{"params": model[0].parameters(), "lr": 1e-6}, {"params": model[1].parameters(), "lr": 1e-7}]
    )
    changes = reimpose_lr(opt, None, [1e-4, 1e-5], reporter=QUIET)
    assert [g["lr"] for g in opt.param_groups] == [1e-4, 1e-5]
    assert [g["initial_lr"] for g in opt.param_groups] == [1e-4, 1e-5]
    assert {c.field for c in changes} == {
        "param_groups[0].lr",
        "param_groups[1].lr",
        "param_groups[0].initial_lr",
        "param_groups[1].initial_lr",
    }
    with pytest.raises(ValueError, match="2 param groups"):
        reimpose_lr(opt, None, [1e-4], reporter=QUIET)
    with pytest.raises(ValueError, match="positive"):
        reimpose_lr(opt, None, -1.0, reporter=QUIET)


def test_without_a_reporter_it_uses_the_current_one_quietly() -> None:
    # Outside a keeper reporter.current() is the no-op one: the call still works and returns.
    opt, s = resume(checkpoint_of_old_run(), lr=1e-4)
    assert reimpose_lr(opt, s, 1e-4)


# ---------------------------------------------------------------------------- argv


@pytest.mark.parametrize(
    ("argv", "lr", "vocab", "warmup"),
    [
        (["python", "train.py", "--lr", "1e-4"], 1e-4, None, None),
        (["train.py", "--lr=3e-4", "--vocab-size", "50257"], 3e-4, 50257, None),
        (["train.py", "config/gpt2.py", "--learning_rate=6e-4", "--warmup_iters=2000"], 6e-4, None, 2000),
        (
            ["train.py", "--learning-rate", "5e-5", "--vocab_size=32000", "--warmup-steps", "500"],
            5e-5,
            32000,
            500,
        ),
        (["train.py", "--lr", "1e-3", "--lr", "2e-3"], 2e-3, None, None),  # the last one wins, as argparse
        (["train.py", "--lr", "auto"], None, None, None),
        (["train.py", "--lr"], None, None, None),
        (["train.py", "--lr", "--vocab-size", "100"], None, 100, None),
        (["train.py", "--lr=-1", "--vocab-size=1", "--warmup_steps=-3"], None, None, None),
        (["train.py", "--lr=nan", "--vocab-size=5e4"], None, 50000, None),
        (["train.py", "--lrate", "1", "--lr_min", "1e-6", "-lr", "2"], None, None, None),
        ([], None, None, None),
    ],
)
def test_requested_from_argv(
    argv: list[str], lr: float | None, vocab: int | None, warmup: int | None
) -> None:
    req = requested_from_argv(argv)
    assert (req.lr, req.vocab_size, req.warmup_steps) == (lr, vocab, warmup)
    assert isinstance(req, p.RequestedConfig)


def test_a_tensor_lr_keeps_its_identity() -> None:
    # Tensor LRs (capturable / fused optimizers, CUDA graphs) must be filled in place, not replaced.
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-6), foreach=False)
    s = sched.StepLR(opt, step_size=10, gamma=0.1)
    train(opt, s, 3)
    lr_tensor = opt.param_groups[0]["lr"]
    reimpose_lr(opt, s, 1e-4, reporter=QUIET)
    assert opt.param_groups[0]["lr"] is lr_tensor and float(lr_tensor) == pytest.approx(1e-4)
    assert train(opt, s, 8)[-1] == pytest.approx(1e-5)
