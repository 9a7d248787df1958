"""The Lightning adapter honours the keeper's "checkpoint now" (a Slurm job's warning signal): a
real tiny Lightning `Trainer` (CPU), the request written as `trainroom launch` writes it, frames
read from a bare socket standing where the keeper listens. The candidate it saves verifies with
the keeper's own verifier and a new `Trainer` resumes from it. (The request's way through a real
keeper and Slurm: tests/e2e/test_slurm.py with the DDP trainer.)"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_integrations import read_frames
from trainroom.core.ckpt import layout
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.promote import expected_for
from trainroom.core.ckpt.verify import verify
from trainroom.core.sdk import reporter as sdk
from trainroom.core.sdk import requests
from trainroom.core.wire import protocol as p

pytest.importorskip("lightning")
lightning_adapter = pytest.importorskip("trainroom.integrations.lightning")
from trainroom.integrations import _checkpoint_request as lightning_request  # noqa: E402


@pytest.fixture
def fresh_reporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sdk, "_current", sdk.NullReporter())
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    monkeypatch.setattr(requests._Poll, "seen", None)
    yield
    sdk.current().close()


def _trainer(max_steps: int, cb: object) -> object:
    import lightning as L

    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )


def test_the_lightning_callback_saves_through_the_trainer_when_the_keeper_asks_once_per_request(
    fresh_reporter: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    keeper_socket: tuple[str, socket.socket],
) -> None:
    import torch

    from tests.support.ckpt_makers.lightning_fit import TinyLM, loader

    path, srv = keeper_socket
    run_dir, root = tmp_path / "run", tmp_path / "root"
    run_dir.mkdir()
    monkeypatch.setenv("TRAINROOM_SOCKET", path)
    monkeypatch.setenv("TRAINROOM_RUN_DIR", str(run_dir))
    monkeypatch.setenv(layout.ENV_ROOT, str(root))
    requests.write_request(run_dir, "USR2-1")  # the job's warning signal came
    cb = lightning_adapter.TrainroomCallback()
    torch.manual_seed(0)
    trainer = _trainer(3, cb)
    trainer.fit(TinyLM(), loader(64))  # type: ignore[attr-defined]
    assert cb.failures == 0
    # One candidate, at the first optimizer step after the request, in the run's quarantine.
    q = root / layout.QUARANTINE
    (saved,) = sorted(x for x in q.iterdir() if x.suffix == ".ckpt")
    assert saved.name == "step-000001.ckpt" and not [x for x in q.iterdir() if x.name.endswith(".tmp")]
    assert lightning_request.QUARANTINE == layout.QUARANTINE  # the name the keeper's layout gives
    # Reported to the keeper, with the note that answers the request.
    msgs = read_frames(srv, 8)
    (ckpt,) = [m for m in msgs if isinstance(m, p.Checkpoint)]
    assert (ckpt.path, ckpt.step, ckpt.digest) == (str(saved), 1, digest_file(saved))
    assert ckpt.size_bytes == saved.stat().st_size
    (note,) = [m for m in msgs if isinstance(m, p.Note) and m.kind == "checkpoint-saved"]
    assert note.step == 1 and str(saved) in note.message
    # What the keeper does with it: its verifier passes it, the model and optimizer in it...
    report = verify(saved, expected_for(root, None, saved))
    assert report.ok, report.reason
    assert report.completeness is not None and report.completeness.marks().startswith("model opt"), report
    # ...and a requeued attempt's Trainer resumes from it (the full state: loops, optimizer).
    assert torch.load(saved, weights_only=False)["global_step"] == 1
    monkeypatch.delenv("TRAINROOM_RUN_DIR")
    again = _trainer(2, lightning_adapter.TrainroomCallback())
    again.fit(TinyLM(), loader(64), ckpt_path=str(saved))  # type: ignore[attr-defined]
    assert again.global_step == 2  # type: ignore[attr-defined]
    assert sorted(x.name for x in q.iterdir() if x.suffix == ".ckpt") == ["step-000001.ckpt"]


def test_without_a_request_or_outside_a_keeper_the_lightning_callback_saves_nothing(
    fresh_reporter: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.ckpt_makers.lightning_fit import TinyLM, loader

    monkeypatch.delenv("TRAINROOM_SOCKET", raising=False)
    monkeypatch.setenv(layout.ENV_ROOT, str(tmp_path / "root"))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("TRAINROOM_RUN_DIR", str(run_dir))
    cb = lightning_adapter.TrainroomCallback()
    _trainer(2, cb).fit(TinyLM(), loader(64))  # type: ignore[attr-defined]
    assert cb.failures == 0 and not (tmp_path / "root").exists()  # nothing asked
    # A request, but no run (not under a keeper): nothing either.
    requests.write_request(run_dir, "USR2-2")
    monkeypatch.delenv("TRAINROOM_RUN_DIR")
    monkeypatch.setattr(requests._Poll, "last_t", float("-inf"))
    _trainer(2, cb).fit(TinyLM(), loader(64))  # type: ignore[attr-defined]
    assert cb.failures == 0 and not (tmp_path / "root").exists()
    assert os.environ.get("TRAINROOM_RUN_DIR") is None
