"""Lightning `.ckpt` files as a real `Trainer.fit` with `ModelCheckpoint` writes them: non-finite
values in callback state (`kth_value = inf`, `best_model_score`) are reported and pass; in the
weights or the optimizer state they reject; a flipped bit is named by the archive's CRC-32."""

from __future__ import annotations

import shutil
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
import torch

from tests.support.ckpt_makers.lightning_fit import fit
from trainroom.core.ckpt import targets
from trainroom.core.ckpt.verify import verify

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real fit of 2 steps, ModelCheckpoint saving every step: step=1.ckpt, step=2.ckpt."""
    d = tmp_path_factory.mktemp("lightning") / "ckpts"
    fit(str(d), max_steps=2, every=1)
    yield d


def _load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def _callback(state: dict[str, Any]) -> dict[str, Any]:
    key = next(k for k in state["callbacks"] if k.startswith("ModelCheckpoint"))
    cb: dict[str, Any] = state["callbacks"][key]
    return cb


def test_a_healthy_checkpoint_with_kth_value_inf_verifies_and_says_so(ckpts: Path) -> None:
    path = ckpts / "step=2.ckpt"
    assert torch.isinf(_callback(_load(path))["kth_value"])  # what ModelCheckpoint stores
    rep = verify(path)
    assert rep.ok, rep.problems
    assert rep.framework == "lightning" and rep.format == "torch-zip"
    assert (rep.step, rep.step_source) == (2, "its global_step")
    assert rep.nonfinite == {}
    [(name, nf)] = rep.nonfinite_metadata.items()
    assert name.startswith("callbacks.ModelCheckpoint") and name.endswith(".kth_value") and nf.inf == 1
    assert any("metadata tensor(s), not weights or optimizer state" in n for n in rep.notes)
    assert rep.model_key == "state_dict" and rep.arch.vocab == 64 and rep.arch.d_model == 32


def test_a_dirpath_is_a_root_whose_highest_step_is_taken(ckpts: Path) -> None:
    assert targets.kind_of(ckpts) == "root"
    assert [u.name for u in targets.units_in(ckpts)] == ["step=1.ckpt", "step=2.ckpt"]
    assert targets.newest_unit(ckpts) == ckpts / "step=2.ckpt"


def test_best_model_score_inf_is_reported_not_rejected(ckpts: Path, tmp_path: Path) -> None:
    state = _load(ckpts / "step=2.ckpt")
    _callback(state)["best_model_score"] = torch.tensor(float("inf"))
    path = tmp_path / "best.ckpt"
    torch.save(state, path)
    rep = verify(path)
    assert rep.ok, rep.problems
    assert sorted(n.rsplit(".", 1)[1] for n in rep.nonfinite_metadata) == ["best_model_score", "kth_value"]


def test_a_nan_in_the_weights_rejects(ckpts: Path, tmp_path: Path) -> None:
    state = _load(ckpts / "step=2.ckpt")
    state["state_dict"]["head.weight"][0, 0] = float("nan")
    path = tmp_path / "nan.ckpt"
    torch.save(state, path)
    rep = verify(path)
    assert not rep.ok
    assert rep.reason == "non-finite values in 1 tensor(s): state_dict.head.weight (1 NaN, 0 Inf)"


def test_an_inf_in_the_optimizer_state_rejects(ckpts: Path, tmp_path: Path) -> None:
    state = _load(ckpts / "step=2.ckpt")
    state["optimizer_states"][0]["state"][0]["momentum_buffer"][1, 1] = float("inf")
    path = tmp_path / "inf.ckpt"
    torch.save(state, path)
    rep = verify(path)
    assert not rep.ok
    assert rep.reason == (
        "non-finite values in 1 tensor(s): optimizer_states.0.state.0.momentum_buffer (0 NaN, 1 Inf)"
    )


def test_a_flipped_byte_is_named_by_the_archive_crc(ckpts: Path, tmp_path: Path) -> None:
    path = tmp_path / "flipped.ckpt"
    shutil.copy(ckpts / "step=2.ckpt", path)
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + 5
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    _load(path)  # torch loads it without a word
    rep = verify(path)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith("corrupt: ") and "do not match the archive's CRC-32" in rep.reason
    named = rep.reason.removeprefix("corrupt: ").split(":")[0]
    assert named.startswith(("state_dict.", "optimizer_states."))
