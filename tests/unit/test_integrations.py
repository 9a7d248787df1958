"""The one-line adapters (trainroom.integrations): a no-op outside a keeper, and under one they
speak the SDK reporter's frames: the HF callback's steps, loss and a checkpoint whose step comes
from its trainer_state.json. (A real Trainer under a real keeper: tests/e2e/test_frameworks_*.)"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainroom.core.sdk import reporter as sdk
from trainroom.core.wire import protocol as p

hf = pytest.importorskip("trainroom.integrations.hf")
torch = pytest.importorskip("torch")


@pytest.fixture
def fresh_reporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """connect() keeps one reporter per process: each test starts without one."""
    monkeypatch.setattr(sdk, "_current", sdk.NullReporter())
    yield
    cur = sdk.current()
    cur.close()


def hooks(cb: object, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW([{"params": [model.weight]}, {"params": [model.bias], "lr": 1e-3}], lr=5e-4)
    args = SimpleNamespace(
        learning_rate=5e-4,
        process_index=0,
        world_size=1,
        output_dir=str(tmp_path),
        get_warmup_steps=lambda n: 0,
        seed=42,
        data_seed=None,
    )
    state = SimpleNamespace(global_step=0, max_steps=10, epoch=0.0, is_world_process_zero=True)
    model.config = SimpleNamespace(vocab_size=64)  # type: ignore[attr-defined]
    cb.on_train_begin(args, state, None, model=model, optimizer=opt)  # type: ignore[attr-defined]
    cb.on_epoch_begin(args, state, None)  # type: ignore[attr-defined]
    state.global_step = 5
    cb.on_step_end(args, state, None, optimizer=opt)  # type: ignore[attr-defined]
    cb.on_log(args, state, None, logs={"loss": 2.5, "grad_norm": 0.75, "learning_rate": 5e-4})  # type: ignore[attr-defined]
    cb.on_log(args, state, None, logs={"eval_loss": 2.4})  # type: ignore[attr-defined]
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    cb.on_save(args, state, None)  # type: ignore[attr-defined]


def test_outside_a_keeper_nothing_is_sent_or_said(
    fresh_reporter: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    cb = hf.TrainroomCallback()
    hooks(cb, tmp_path)
    assert not cb.active and cb.failures == 0
    assert capsys.readouterr() == ("", "")


def read_frames(srv: socket.socket, want: int) -> list[p.TrainerMsg]:
    conn, _ = srv.accept()
    conn.settimeout(10)
    reader = p.FrameReader(p.inbound_decoder, p.MAX_INBOUND_FRAME)
    msgs: list[p.TrainerMsg] = []
    deadline = time.monotonic() + 30
    try:
        while len([m for m in msgs if not isinstance(m, p.Heartbeat)]) < want and time.monotonic() < deadline:
            data = conn.recv(65536)
            if not data:
                break
            msgs += reader.feed(data)  # type: ignore[arg-type]
    finally:
        conn.close()
    return [m for m in msgs if not isinstance(m, p.Heartbeat)]


def test_under_a_keeper_the_hf_callback_speaks_the_sdk_frames(
    fresh_reporter: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keeper_socket: tuple[str, socket.socket],
) -> None:
    path, srv = keeper_socket
    monkeypatch.setenv("TRAINROOM_SOCKET", path)
    monkeypatch.setenv("RANK", "3")  # the Trainer's own process_index wins over the environment
    cb = hf.TrainroomCallback()
    hooks(cb, tmp_path)
    msgs = read_frames(srv, 5)
    hello = msgs[0]
    assert isinstance(hello, p.Hello) and hello.rank == 0 and hello.pid == os.getpid()
    assert hello.config.lr == 5e-4 and hello.config.vocab_size == 64 and hello.config.warmup_steps == 0
    note, first, logged, ckpt = msgs[1:5]
    assert isinstance(note, p.Note) and note.kind == "epoch"
    assert isinstance(first, p.Step) and (first.step, first.loss, first.lr) == (5, None, [5e-4, 1e-3])
    assert isinstance(logged, p.Step) and (logged.step, logged.loss, logged.grad_norm) == (5, 2.5, 0.75)
    # Each step names its batch as the Trainer's sampler finds it again (`trainroom replay`).
    assert first.batch == logged.batch == p.BatchRef(epoch=0, index=5, seed=42)
    assert isinstance(ckpt, p.Checkpoint) and (ckpt.path, ckpt.step) == (str(tmp_path / "checkpoint-5"), 5)
    assert cb.failures == 0


def test_the_hf_callback_saves_when_the_keeper_asks_and_only_once_per_request(
    fresh_reporter: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainroom.core.sdk import requests

    monkeypatch.setenv("TRAINROOM_RUN_DIR", str(tmp_path))
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    monkeypatch.setattr(requests._Poll, "seen", None)
    cb = hf.TrainroomCallback()
    args, state = SimpleNamespace(), SimpleNamespace(global_step=7)
    control = SimpleNamespace(should_save=False)
    cb.on_step_end(args, state, control)
    assert control.should_save is False  # nothing asked
    requests.write_request(tmp_path, "USR2-1")
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    cb.on_step_end(args, state, control)
    assert control.should_save is True
    control.should_save = False
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    cb.on_step_end(args, state, control)
    assert control.should_save is False  # the same request is answered once
    assert cb.failures == 0
