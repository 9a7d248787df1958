"""Hugging Face checkpoints as the real `Trainer` writes them (a tiny GPT2LMHeadModel from a config,
AdamW after real steps, `Trainer._save_checkpoint`), and plain safetensors files: what verifies,
what each corruption is rejected for, and where the step comes from."""

from __future__ import annotations

import argparse
import json
import shutil
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("transformers")
import torch
from safetensors.torch import load_file, save_file

from tests.support.ckpt_makers.hf_trainer import make_trainer, tiny_model
from trainroom.core.ckpt import layout, targets, watch
from trainroom.core.ckpt.promote import keep_verified_copy
from trainroom.core.ckpt.verify import verify
from trainroom.core.keeper.recovery import watched_target

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def hf_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real Trainer run of 4 steps saving at 2 and 4: out/checkpoint-2/, out/checkpoint-4/."""
    out = tmp_path_factory.mktemp("hf") / "out"
    make_trainer(str(out), max_steps=4, save_steps=2).train()
    yield out


def _copy(hf_out: Path, tmp_path: Path, step: int = 4) -> Path:
    dst = tmp_path / f"checkpoint-{step}"
    shutil.copytree(hf_out / f"checkpoint-{step}", dst)
    return dst


def _flip_in_record(path: Path, want: str) -> str:
    """Flip one byte in the middle of the largest zip record whose name contains `want`."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if want in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    return info.filename


def test_a_trainer_checkpoint_verifies_every_file_with_the_step_from_trainer_state(hf_out: Path) -> None:
    ckpt = hf_out / "checkpoint-4"
    rep = verify(ckpt)
    assert rep.ok, rep.problems
    assert (rep.format, rep.framework) == ("hf-checkpoint", "hugging-face")
    assert rep.step == json.loads((ckpt / "trainer_state.json").read_text())["global_step"] == 4
    assert rep.step_source == "trainer_state.json"
    roles = {f.name: f.role for f in rep.files}
    assert roles == {
        "config.json": "config",
        "generation_config.json": "config",
        "model.safetensors": "model",
        "optimizer.pt": "optimizer",
        "rng_state.pth": "metadata",
        "scheduler.pt": "metadata",
        "trainer_state.json": "config",
        "training_args.bin": "not-loaded",
    }
    assert rep.size_bytes == sum(f.stat().st_size for f in ckpt.iterdir())
    # Weights and AdamW's state were loaded (two moments per parameter tensor), numpy's RNG too.
    files = {f.name: f for f in rep.files}
    n_params = len(tiny_model().state_dict())
    assert files["model.safetensors"].tensors > 0 and files["optimizer.pt"].tensors >= 2 * n_params - 4
    assert files["rng_state.pth"].tensors >= 1
    # The architecture read off the weights is the one config.json declares.
    assert (rep.arch.layers, rep.arch.d_model, rep.arch.vocab) == (2, 32, 64) and rep.arch_mismatch == []
    # training_args.bin is a pickled TrainingArguments: never unpickled, checked as an archive.
    note = next(n for n in rep.notes if n.startswith("training_args.bin:"))
    assert "not unpickled" in note and "transformers" in note and "CRC-32" in note


def test_verify_names_the_checkpoint_a_root_or_file_stands_for(
    hf_out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainroom.core.cli import ckpt as cli

    def verb(*argv: str) -> int:
        ap = argparse.ArgumentParser(prog="trainroom")
        cli.add_parser(ap.add_subparsers())
        args = ap.parse_args(["verify", *argv])
        return int(args.func(args))

    assert targets.kind_of(hf_out) == "root"
    assert [u.name for u in targets.units_in(hf_out)] == ["checkpoint-2", "checkpoint-4"]
    assert verb(str(hf_out), "--json") == 0  # the output dir: its highest step
    assert json.loads(capsys.readouterr().out)["path"] == str(hf_out / "checkpoint-4")
    assert verb(str(hf_out / "checkpoint-2")) == 0
    text = capsys.readouterr().out
    assert text.startswith("OK ") and "step 2 (from trainer_state.json)" in text
    assert "not-loaded" in text and "note: training_args.bin: not unpickled" in text
    # A watched model.safetensors takes its step from the checkpoint directory holding it.
    rep = verify(hf_out / "checkpoint-4" / "model.safetensors")
    assert rep.ok and rep.step == 4 and rep.step_source == "checkpoint-4/trainer_state.json"


def test_a_nan_in_a_weight_is_rejected_naming_file_and_tensor(hf_out: Path, tmp_path: Path) -> None:
    ckpt = _copy(hf_out, tmp_path)
    weights = load_file(str(ckpt / "model.safetensors"))
    weights["transformer.h.1.mlp.c_fc.weight"][0, :3] = float("nan")
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    rep = verify(ckpt)
    assert not rep.ok
    assert rep.reason == (
        "model.safetensors: non-finite values in 1 tensor(s): transformer.h.1.mlp.c_fc.weight (3 NaN, 0 Inf)"
    )
    assert set(rep.nonfinite) == {"model.safetensors:transformer.h.1.mlp.c_fc.weight"}
    assert [f.name for f in rep.files if not f.ok] == ["model.safetensors"]


def test_a_truncated_safetensors_file_is_rejected(hf_out: Path, tmp_path: Path) -> None:
    ckpt = _copy(hf_out, tmp_path)
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-777])
    rep = verify(ckpt)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith("model.safetensors: truncated: the file ends early"), rep.reason


def test_a_flipped_byte_in_optimizer_state_is_rejected_naming_the_tensor(
    hf_out: Path, tmp_path: Path
) -> None:
    ckpt = _copy(hf_out, tmp_path)
    _flip_in_record(ckpt / "optimizer.pt", "/data/")
    torch.load(ckpt / "optimizer.pt", weights_only=True)  # torch itself loads it without a word
    rep = verify(ckpt)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith("optimizer.pt: corrupt: state.") and "CRC-32" in rep.reason, rep.reason
    # ... and the directory's digest moved, so a recorded one no longer matches either.
    assert rep.digest != verify(hf_out / "checkpoint-4").digest


def test_training_args_is_checked_without_unpickling(hf_out: Path, tmp_path: Path) -> None:
    ckpt = _copy(hf_out, tmp_path)
    _flip_in_record(ckpt / "training_args.bin", "data.pkl")
    rep = verify(ckpt)
    assert not rep.ok and rep.reason is not None
    assert rep.reason.startswith("training_args.bin: corrupt: archive record"), rep.reason


def test_a_save_cut_before_trainer_state_is_incomplete(hf_out: Path, tmp_path: Path) -> None:
    ckpt = _copy(hf_out, tmp_path)
    (ckpt / "trainer_state.json").unlink()
    rep = verify(ckpt)
    assert (
        not rep.ok and rep.reason is not None and rep.reason.startswith("incomplete: no trainer_state.json")
    )
    assert rep.step == 4 and rep.step_source == "the directory name"


def test_sharded_safetensors_are_read_through_their_index(hf_out: Path, tmp_path: Path) -> None:
    ckpt = _copy(hf_out, tmp_path)
    (ckpt / "model.safetensors").unlink()
    tiny_model().save_pretrained(ckpt, max_shard_size="40KB")
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2
    rep = verify(ckpt)
    assert rep.ok, rep.problems
    assert {f.name for f in rep.files if f.role == "model"} == set(shards)
    assert rep.arch.layers == 2 and rep.tensors > 0
    (ckpt / shards[-1]).unlink()
    rep = verify(ckpt)
    assert not rep.ok and rep.reason == f"model.safetensors.index.json: shard(s) missing: {shards[-1]}"


def test_plain_safetensors_step_from_metadata_or_name(tmp_path: Path) -> None:
    weights = tiny_model().state_dict()
    weights.pop("lm_head.weight")  # tied to wte: safetensors refuses shared storage
    a = tmp_path / "weights.safetensors"
    save_file(weights, str(a), metadata={"step": "140"})
    rep = verify(a)
    assert (
        rep.ok
        and rep.format == "safetensors"
        and (rep.step, rep.step_source) == (140, "safetensors metadata")
    )
    b = tmp_path / "model-step_120.safetensors"
    save_file(weights, str(b))
    rep = verify(b)
    assert rep.ok and (rep.step, rep.step_source) == (120, "the file name")
    c = tmp_path / "model.safetensors"
    save_file(weights, str(c))
    assert verify(c).step is None  # nothing says: no step invented


# ------------------------------------------------------------------------------ watched, kept, resumed


class _Pipe:
    """What `watched_target` reads of the keeper's checkpoint pipeline."""

    def __init__(self, state: watch.WatchState) -> None:
        self.watch_state = state


def _watch_until_verified(patterns: list[str], cwd: Path) -> watch.WatchState:
    state = watch.WatchState()
    state, requests, _ = watch.poll(state, watch.sight(patterns, cwd), now=0.0)
    assert requests == []  # settling first
    state, requests, _ = watch.poll(state, watch.sight(patterns, cwd), now=watch.SETTLE_S)
    for req in requests:
        rep = verify(req.path, req.expected)
        state, _, stood = watch.record_verdict(state, req, rep, watch.stat_one(req.path), now=3.0)
        assert stood
    return state


def test_a_watched_output_dir_yields_each_checkpoint_directory_and_its_version(
    hf_out: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(hf_out, out)
    seen = watch.sight(["out"], tmp_path)
    assert [Path(s.path).name for s in seen] == ["checkpoint-2", "checkpoint-4"]
    assert seen[1].size == sum(f.stat().st_size for f in (out / "checkpoint-4").iterdir())
    assert [s.path for s in watch.sight(["out/checkpoint-*"], tmp_path)] == [s.path for s in seen]
    # A file written into the directory is a new version of the checkpoint.
    (out / "checkpoint-4" / "trainer_state.json").write_text("{}")
    after = watch.stat_one(seen[1].path)
    assert after is not None and after.version != seen[1].version


def test_resume_takes_the_highest_verified_step_of_watched_directories(hf_out: Path, tmp_path: Path) -> None:
    shutil.copytree(hf_out, tmp_path / "out")
    state = _watch_until_verified(["out"], tmp_path)
    files = {Path(f.path).name: f for f in state.files.values()}
    assert {k: (f.state, f.step) for k, f in files.items()} == {
        "checkpoint-2": ("verified", 2),
        "checkpoint-4": ("verified", 4),
    }
    target = watched_target(_Pipe(state))  # type: ignore[arg-type]
    assert target is not None and target.path == str(tmp_path / "out" / "checkpoint-4") and target.step == 4
    # The case: the watched files are model.safetensors, their step from the directory.
    state = _watch_until_verified(["out/checkpoint-*/model.safetensors"], tmp_path)
    assert sorted(f.step for f in state.files.values()) == [2, 4]
    target = watched_target(_Pipe(state))  # type: ignore[arg-type]
    assert target is not None and target.path.endswith("checkpoint-4/model.safetensors")


def test_a_verified_copy_of_a_directory_is_promoted_and_resumable(hf_out: Path, tmp_path: Path) -> None:
    src = _copy(hf_out, tmp_path)
    root = tmp_path / "root"
    rep = verify(src)
    assert rep.ok
    target = keep_verified_copy(src, rep, root)
    assert target is not None and target.name == "step-000004"
    copy = target / "checkpoint-4"
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in src.iterdir())
    assert layout.latest_checkpoint(root) == copy
    # The manifest's digest is the directory's: verifying the copy in place matches it.
    again = verify(copy)
    assert again.ok and again.digest_ok is True and again.step == 4
    # A copy changed while it was made is dropped, not promoted.
    (src / "scheduler.pt").write_bytes((src / "scheduler.pt").read_bytes() + b"\0")
    assert keep_verified_copy(src, rep, root) is None
    assert [c.step for c in layout.verified_checkpoints(root)] == [4]
    assert not any(p.name.endswith(".tmp") for p in (root / layout.QUARANTINE).iterdir())
    # A copy cut short by a kill leaves a temp directory that the next sweep removes.
    stale = root / layout.QUARANTINE / ".checkpoint-2.999999.tmp"
    shutil.copytree(hf_out / "checkpoint-2", stale)
    assert layout.Quarantine(root).sweep() == [f"removed {stale}"]


def test_prune_deletes_old_verified_copies_never_the_trainers_own(hf_out: Path, tmp_path: Path) -> None:
    from trainroom.core.ops import prune

    root = tmp_path / "root"
    for step in (2, 4):
        src = hf_out / f"checkpoint-{step}"
        assert keep_verified_copy(src, verify(src), root) is not None
    res = prune.execute(prune.plan(root, keep=1))
    assert [(t.step, Path(t.path).name) for t in res.deleted] == [(2, "step-000002")]
    assert (
        not (root / "step-000002").exists()
        and layout.latest_checkpoint(root) == root / "step-000004" / "checkpoint-4"
    )
    # Pointed at the trainer's output dir, prune lists its checkpoints and deletes none of them.
    plan = prune.plan(hf_out, keep=0)
    assert plan.delete == []
    assert [(Path(k.path).name, k.step) for k in plan.skipped] == [("checkpoint-2", 2), ("checkpoint-4", 4)]
    assert all(k.why.startswith("a trainer's own checkpoint") for k in plan.skipped)
