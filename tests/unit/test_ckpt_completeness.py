"""Completeness per checkpoint, read by the verifier from checkpoints the real libraries wrote: a
torch.save dict (nanoGPT's layout) with and without its optimizer, a Hugging Face `checkpoint-N/`
from a real tiny Trainer with and without `save_only_model`, a Lightning `.ckpt` from a real tiny
Trainer with and without `save_weights_only`, a torch.distributed.checkpoint directory with and
without optimizer and scheduler, and a lone safetensors file (a model only)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.support.ckpt_makers.dcp_save import small_state
from trainroom.core.ckpt.verify import verify
from trainroom.core.resumable import Completeness, losses

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _parts(path: Path) -> Completeness:
    rep = verify(path)
    assert rep.ok, rep.reason
    assert rep.completeness is not None
    return rep.completeness


def _nanogpt(with_optimizer: bool) -> dict[str, object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 16), nn.Linear(16, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 64, (2, 4))).sum().backward()
    opt.step()
    ckpt: dict[str, object] = {
        "model": model.state_dict(),
        "model_args": {"n_layer": 0, "vocab_size": 64},
        "iter_num": 20,
        "best_val_loss": torch.tensor(3.0),
        "config": {"learning_rate": 1e-3, "git_sha": "0123456789abcdef"},
    }
    if with_optimizer:
        ckpt["optimizer"] = opt.state_dict()
    return ckpt


def test_a_torch_save_dict_with_and_without_its_optimizer(tmp_path: Path) -> None:
    full, bare = tmp_path / "ckpt.pt", tmp_path / "weights.pt"
    torch.save(_nanogpt(True), full)
    torch.save(_nanogpt(False), bare)
    c = _parts(full)
    assert c.parts["optimizer"].seen == "optimizer: AdamW moments for 3 params"
    assert c.parts["model"].seen == "3 tensors under 'model'"
    assert c.parts["step"].seen == "iter_num 20"
    assert c.holds("config") and c.parts["code"].seen == "git_sha 0123456789ab"
    # nanoGPT's LR is get_lr(iter_num): the step stands for the scheduler.
    assert c.holds("scheduler") and "iter_num 20" in c.parts["scheduler"].seen
    assert c.lacks() == ["rng", "data"] and c.marks() == "model opt sched -rng -data"
    b = _parts(bare)
    assert not b.holds("optimizer") and b.holds("model") and b.holds("step")
    assert b.marks() == "model -opt sched -rng -data"
    lost = losses(b, step=20)
    assert lost[0] == "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)"
    assert "data position absent: batches 0–20 seen again" in lost
    assert "RNG absent: a different data order and dropout from here on" in lost


def test_a_bare_state_dict_and_a_lone_safetensors_file_are_a_model_only(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    sd = small_state()["model"]
    torch.save(sd, tmp_path / "sd.pt")
    save_file(sd, str(tmp_path / "model.safetensors"))
    for name in ("sd.pt", "model.safetensors"):
        c = _parts(tmp_path / name)
        assert c.held() == ["model"] and c.parts["model"].seen == "5 tensors under a bare state_dict", name
        assert set(c.lacks()) == {"optimizer", "scheduler", "rng", "data", "step", "config", "code"}


def test_an_fp16_training_state_holds_every_part_the_scaler_and_each_generator(tmp_path: Path) -> None:
    """What a careful trainer saves: weights, AdamW, its LinearLR, the fp16 GradScaler after a
    real scaled step, torch/numpy/python RNG states, the sampler's position, the step and config."""
    import random

    import numpy as np

    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, total_iters=10)
    scaler = torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.ones(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "lr_scheduler": sched.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        "sampler": {"epoch": 1, "batches_seen": 7},
        "step": 7,
        "config": {"lr": 1e-3, "git_commit": "feedfacecafe0001"},
    }
    torch.save(state, tmp_path / "state.pt")
    c = _parts(tmp_path / "state.pt")
    assert c.lacks() == [] and c.marks() == "model opt sched rng data"
    assert c.parts["scaler"].seen == f"scaler: loss scale {scaler.get_scale():g}"
    assert c.parts["rng"].seen == "rng: torch, numpy, python"
    assert c.parts["scheduler"].seen == "lr_scheduler: at step 1"
    assert c.parts["data"].seen == "sampler" and c.parts["code"].seen == "git_commit feedfacecafe"
    assert losses(c, step=7, fp16=True) == []
    # Without its scaler, an fp16 run loses its loss scale on a resume.
    del state["scaler"]
    torch.save(state, tmp_path / "no-scaler.pt")
    assert losses(_parts(tmp_path / "no-scaler.pt"), step=7, fp16=True) == [
        "loss scaler absent: the fp16 loss scale restarts at its initial value"
    ]


# --------------------------------------------------------------------------- Hugging Face


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two real 2-step Trainer runs, one saving everything, one with save_only_model=True."""
    pytest.importorskip("transformers")
    from tests.support.ckpt_makers.hf_trainer import make_trainer

    base = tmp_path_factory.mktemp("hf")
    make_trainer(str(base / "full"), max_steps=2, save_steps=2).train()
    make_trainer(str(base / "model"), max_steps=2, save_steps=2, save_only_model=True).train()
    yield base / "full" / "checkpoint-2", base / "model" / "checkpoint-2"


def test_an_hf_checkpoint_holds_every_part_from_its_files(hf_runs: tuple[Path, Path]) -> None:
    c = _parts(hf_runs[0])
    assert c.parts["optimizer"].seen == "optimizer.pt: AdamW moments for 28 params"
    assert c.parts["scheduler"].seen == "scheduler.pt: at step 2"
    assert c.parts["rng"].seen == "rng_state.pth: torch, numpy, python"
    assert c.parts["step"].seen == "trainer_state.json global_step 2"
    assert c.parts["data"].seen.startswith("trainer_state.json: epoch 0.01562, step 2")
    assert c.parts["model"].seen == "model.safetensors: 28 tensors"
    assert c.parts["config"].seen == "config.json, training_args.bin"
    assert c.lacks() == ["code"] and c.marks() == "model opt sched rng data"
    assert losses(c, step=2) == []


def test_an_hf_checkpoint_of_an_fp16_run_holds_its_scaler_pt(
    hf_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """The Trainer writes the accelerator's GradScaler state as scaler.pt (fp16 on a GPU): the
    same torch.save of a real scaler's state here."""
    import shutil

    ckpt = tmp_path / "checkpoint-2"
    shutil.copytree(hf_runs[0], ckpt)
    torch.save(torch.amp.GradScaler("cpu").state_dict(), ckpt / "scaler.pt")
    c = _parts(ckpt)
    assert c.parts["scaler"].seen == "scaler.pt: loss scale 65536"


def test_an_hf_checkpoint_saved_with_save_only_model_lacks_optimizer_scheduler_rng(
    hf_runs: tuple[Path, Path],
) -> None:
    c = _parts(hf_runs[1])
    assert c.lacks() == ["optimizer", "scheduler", "rng", "code"]
    assert c.holds("model") and c.holds("data") and c.holds("step")
    assert c.marks() == "model -opt -sched -rng data"
    assert losses(c, step=2) == [
        "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)",
        "scheduler absent: the LR restarts at warm-up",
        "RNG absent: a different data order and dropout from here on",
    ]


# --------------------------------------------------------------------------- Lightning


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Two real 2-step fits, one with save_weights_only=True."""
    pytest.importorskip("lightning")
    from tests.support.ckpt_makers.lightning_fit import fit

    base = tmp_path_factory.mktemp("lightning")
    fit(str(base / "full"), max_steps=2, every=2)
    fit(str(base / "weights"), max_steps=2, every=2, weights_only=True)
    yield base / "full" / "step=2.ckpt", base / "weights" / "step=2.ckpt"


def test_a_lightning_checkpoint_with_and_without_its_optimizer(lightning_runs: tuple[Path, Path]) -> None:
    full, weights = (_parts(p) for p in lightning_runs)
    assert full.parts["optimizer"].seen == "optimizer_states: SGD momentum for 3 params"
    assert full.parts["scheduler"].seen == "lr_schedulers: at step 0"
    assert full.parts["step"].seen == "global_step 2"
    assert full.parts["config"].seen == "hyper_parameters (1 entries)"
    # The loops count the batches; no stateful loader: a mid-epoch resume starts the epoch over.
    assert not full.holds("data") and "2 batches processed" in full.parts["data"].seen
    assert full.marks() == "model opt sched -rng -data"
    assert weights.marks() == "model -opt -sched -rng -data"
    assert weights.holds("step") and weights.holds("config")
    assert "data position absent: batches 0–2 seen again (loops: epoch 0, 2 batches processed" in "\n".join(
        losses(weights, step=2)
    )


def test_a_lightning_fit_with_a_stateful_loader_holds_its_data_position(tmp_path: Path) -> None:
    """A loader with state_dict/load_state_dict: Lightning keeps its state under the fit loop's
    `combined_loader`, and a mid-epoch resume goes on where it was."""
    pytest.importorskip("lightning")
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from tests.support.ckpt_makers.lightning_fit import TinyLM

    class Stateful(torch.utils.data.DataLoader[torch.Tensor]):
        def state_dict(self) -> dict[str, int]:
            return {"batches": 2}

        def load_state_dict(self, sd: dict[str, int]) -> None:
            pass

    g = torch.Generator().manual_seed(0)
    loader = Stateful(torch.randint(0, 64, (64, 8), generator=g), batch_size=8)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path), filename="{step}", every_n_train_steps=2, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        callbacks=[ckpt],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyLM(), loader)
    c = _parts(tmp_path / "step=2.ckpt")
    assert c.parts["data"].seen == "loops: epoch 0, 2 batches processed, the loader's state"
    assert c.marks() == "model opt sched -rng data"


# --------------------------------------------------------------------------- DCP


def test_a_dcp_directory_with_and_without_optimizer_and_scheduler(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = small_state(step=10)
    opt = torch.optim.AdamW([nn.Parameter(torch.zeros(2))], lr=1e-3)
    state["lr_scheduler"] = torch.optim.lr_scheduler.LinearLR(opt).state_dict()
    state["rng"] = {"torch": torch.get_rng_state()}
    dcp.save(state, checkpoint_id=str(tmp_path / "full"))
    dcp.save({"model": state["model"], "step": 10}, checkpoint_id=str(tmp_path / "model"))
    full = _parts(tmp_path / "full")
    assert full.parts["optimizer"].seen == "optim: AdamW moments for 5 params"
    assert full.parts["scheduler"].seen == "lr_scheduler: at step 0"
    assert full.parts["rng"].seen == "rng: torch" and full.parts["step"].seen == "step 10"
    assert full.marks() == "model opt sched rng -data"
    bare = _parts(tmp_path / "model")
    assert bare.marks() == "model -opt -sched -rng -data" and bare.holds("step")


def test_dcp_metadata_alone_says_what_the_directory_holds(tmp_path: Path) -> None:
    """A DCP directory whose load is not run (host RAM short) is still read from its keys."""
    import torch.distributed.checkpoint as dcp

    dcp.save(small_state(step=10), checkpoint_id=str(tmp_path / "d"))
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 1000 kB\nMemAvailable: 1 kB\n")
    rep = verify(tmp_path / "d", meminfo_path=str(meminfo))
    assert rep.deferred and rep.completeness is not None
    assert rep.completeness.parts["optimizer"].seen == "optim: Adam moments for 5 params"
    assert rep.completeness.marks() == "model opt -sched -rng -data"


def test_completeness_never_breaks_a_verify_of_an_odd_state(tmp_path: Path) -> None:
    """Keys that look like parts but hold something else: read as far as they go, never raised."""
    odd = {
        "model": {"w": torch.ones(2)},
        "optimizer": [1, 2, 3],
        "scheduler": "cosine",
        "rng": torch.ones(3, dtype=torch.uint8),
        "step": torch.tensor(7),
        "sampler": {"epoch": 2},
    }
    torch.save(odd, tmp_path / "odd.pt")
    c = _parts(tmp_path / "odd.pt")
    assert c.holds("rng") and c.parts["step"].seen == "step 7" and c.holds("data")
    assert not c.holds("optimizer") and not c.holds("scheduler")


def test_the_demo_trainers_layout_counts_tokens_seen_as_its_data_position(tmp_path: Path) -> None:
    """The bundled demo saves model, optimizer, scheduler, step, tokens and config: no RNG."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "step": 40,
        "tokens": 40 * 2048,
        "config": {"lr": 1e-3},
    }
    torch.save(state, tmp_path / "step-000040.pt")
    c = _parts(tmp_path / "step-000040.pt")
    assert c.marks() == "model opt sched -rng data" and c.parts["data"].seen == "tokens 81920"
    assert c.parts["optimizer"].seen == "optimizer: state empty (no step taken yet), 1 param group(s)"
