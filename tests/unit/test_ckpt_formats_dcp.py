"""torch.distributed.checkpoint directories as `dcp.save` writes them (one process, no process
group): recognised, every file digested, tensors read through `dcp.load(no_dist=True)`, the step
from the state or the directory name, and `.metadata` never unpickled with anything but DCP's
own classes."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from tests.support.ckpt_makers.dcp_save import save, small_state
from trainroom.core.ckpt import targets
from trainroom.core.ckpt.verify import verify

pytestmark = pytest.mark.filterwarnings("ignore")


def _dcp(tmp_path: Path, name: str = "step-10", step: int = 10) -> Path:
    d = tmp_path / name
    save(str(d), step=step)
    return d


def test_a_dcp_directory_verifies_with_its_step(tmp_path: Path) -> None:
    d = _dcp(tmp_path)
    assert targets.kind_of(d) == "dcp-checkpoint"
    rep = verify(d)
    assert rep.ok, rep.problems
    assert (rep.format, rep.framework) == ("dcp-checkpoint", "dcp")
    assert (rep.step, rep.step_source) == (10, "its step")
    assert {f.name for f in rep.files} == {".metadata", "__0_0.distcp"}
    model = small_state()["model"]
    assert rep.model_key == "model" and rep.params == sum(t.numel() for t in model.values())
    assert rep.tensors > len(model)  # the AdamW moments were read too


def test_the_step_from_the_directory_name_when_the_state_has_none(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "checkpoint-30"
    state = small_state()
    del state["step"]
    dcp.save(state, checkpoint_id=str(d))
    rep = verify(d)
    assert rep.ok and (rep.step, rep.step_source) == (30, "the directory name")


def test_a_nan_in_a_weight_rejects_naming_it(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    state = small_state()
    state["model"]["1.weight"][2, 3] = float("nan")
    d = tmp_path / "step-10"
    dcp.save(state, checkpoint_id=str(d))
    rep = verify(d)
    assert not rep.ok and rep.reason == "non-finite values in 1 tensor(s): model.1.weight (1 NaN, 0 Inf)"


def test_a_flipped_byte_and_a_cut_shard_reject(tmp_path: Path) -> None:
    good = _dcp(tmp_path)
    flipped = tmp_path / "flipped"
    shutil.copytree(good, flipped)
    shard = flipped / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    rep = verify(flipped)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith("corrupt: ") and "do not match their CRC-32" in rep.reason, rep.reason
    cut = tmp_path / "cut"
    shutil.copytree(good, cut)
    shard = cut / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:-100])
    rep = verify(cut)
    assert not rep.ok and rep.reason == f"__0_0.distcp: truncated: {size - 100} of {size} bytes on disk"


class _RunsCode:
    """A pickle that would run a command when unpickled by plain `pickle.load`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_foreign_metadata_pickle_is_refused_and_never_run(tmp_path: Path) -> None:
    d = _dcp(tmp_path)
    marker = tmp_path / "ran"
    (d / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    rep = verify(d)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith(".metadata: corrupt: UnpicklingError: Unsupported global: posix.system")
    assert not marker.exists()
