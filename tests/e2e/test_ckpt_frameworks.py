"""Framework checkpoints end to end: a real Hugging Face `Trainer` run and a real Lightning run
under `trainroom launch`, uninstrumented, their checkpoint directory watched. Each dies by
SIGKILL after two saves; their checkpoints verify and are promoted (verified copies), a corrupted
copy dropped beside them is rejected naming the file and the tensor, and `trainroom resume`
continues from the highest verified step (the template given with --resume-template).
Waits are on what the keeper reports, with generous bounds for a loaded 2-core machine."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.helpers import run_cli, status
from tests.support.waiting import wait_for
from trainroom.core.ckpt import layout
from trainroom.core.journal import file as journal
from trainroom.core.run import store as runs
from trainroom.core.wire import protocol

MAKERS = Path(__file__).parents[1] / "support" / "ckpt_makers"
START_S = 240.0  # transformers' or lightning's import, and torch's in the verifier, on a loaded machine
PY = shlex.quote(sys.executable)


def _launch(project: Path, template: str, watch: str, cmd: list[str]) -> runs.RunInfo:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainroom.cli",
            "launch",
            "--watch-ckpt",
            watch,
            "--keep-verified-copies",
            "--resume-template",
            template,
            "--",
            *cmd,
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    return runs.resolve_run(out.stdout.strip())


def _journal(info: runs.RunInfo) -> list[Any]:
    return list(journal.read_journal(Path(info.run_dir) / runs.JOURNAL_NAME))


def _root(info: runs.RunInfo) -> Path:
    return runs.read_record(Path(info.run_dir)).checkpoint_root(info.run_dir)


def _states(d: dict[str, Any]) -> dict[str, tuple[int | None, str]]:
    return {c["path"]: (c["step"], c["state"]) for c in d["checkpoints"]}


def _cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    out = run_cli(*args, "--json", timeout=180)
    assert out.stdout.strip(), f"no JSON from {args}: rc {out.returncode}, stderr {out.stderr!r}"
    return out.returncode, json.loads(out.stdout)


def _dead_with_verified(info: runs.RunInfo, watched: list[Path]) -> dict[str, Any]:
    """The trainer died, and each watched checkpoint verified with a copy promoted."""

    def done() -> dict[str, Any] | None:
        s = status(info)
        states = _states(s)
        copies = [c for c in s["checkpoints"] if c["state"] == "verified" and str(_root(info)) in c["path"]]
        ok = all(states.get(str(w), (None, ""))[1] == "verified" for w in watched)
        return s if s["state"] == "dead" and ok and len(copies) >= len(watched) else None

    return wait_for(done, timeout=START_S, what=f"DEAD and {[w.name for w in watched]} verified and copied")


def _rejected(info: runs.RunInfo, path: Path) -> dict[str, Any]:
    def said() -> dict[str, Any] | None:
        s = status(info)
        f = next(
            (
                f
                for f in s["findings"]
                if f["code"] == "CKPT_REJECTED" and f["evidence"].get("path") == str(path)
            ),
            None,
        )
        return f

    return wait_for(said, timeout=START_S, what=f"CKPT_REJECTED for {path.name}")


def _resume_and_finish(info: runs.RunInfo, checkpoint: Path, step: int) -> dict[str, Any]:
    rc, res = _cli_json("resume", info.run_id, "--yes")
    assert rc == 0 and res["ok"], res
    assert res["plan"]["checkpoint"] == str(checkpoint) and res["plan"]["step"] == step
    return wait_for(
        lambda: (s := status(info))["state"] == "exited" and s["attempt"] == 2 and s,
        timeout=START_S,
        what="attempt 2 runs to its end",
    )


def test_hf_trainer_checkpoints_verify_promote_reject_a_corrupt_copy_and_resume(
    trhome: Path, tmp_path: Path
) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file, save_file

    project = tmp_path / "project"
    shutil.copytree(MAKERS, project)
    args = "hf_trainer.py --output-dir out --max-steps 40 --save-steps 10"
    # The Trainer's own choice: the newest checkpoint-N/ in its output_dir.
    template = f"{PY} {args} --resume_from_checkpoint True"
    info = _launch(project, template, "out", [sys.executable, *args.split(), "--die-at", "25"])
    out = project / "out"
    d = _dead_with_verified(info, [out / "checkpoint-10", out / "checkpoint-20"])
    assert d["exit"]["signal_name"] == "SIGKILL"
    root = _root(info)
    copy20 = root / "step-000020" / "checkpoint-20"
    assert sorted(p.name for p in copy20.iterdir()) == sorted(
        p.name for p in (out / "checkpoint-20").iterdir()
    )
    assert layout.latest_checkpoint(root) == copy20
    report = next(
        r.report
        for r in _journal(info)
        if isinstance(r, protocol.CheckpointState)
        and r.path == str(out / "checkpoint-20")
        and r.state == "verified"
    )
    assert report.format == "hf-checkpoint" and report.tensors > 0
    assert any(n.startswith("training_args.bin: not unpickled") for n in report.notes)

    # A corrupted copy that claims the highest step: rejected, naming the file and the tensor.
    bad = out / "checkpoint-99"
    shutil.copytree(out / "checkpoint-20", bad)
    weights = load_file(str(bad / "model.safetensors"))
    weights["transformer.h.0.attn.c_attn.weight"][0, 0] = float("nan")
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    state = json.loads((bad / "trainer_state.json").read_text())
    (bad / "trainer_state.json").write_text(json.dumps({**state, "global_step": 99}))
    f = _rejected(info, bad)
    assert (
        "model.safetensors: non-finite values in 1 tensor(s): transformer.h.0.attn.c_attn.weight"
        in f["message"]
    )
    cli = run_cli("verify", str(bad))
    assert cli.returncode == 1 and "transformer.h.0.attn.c_attn.weight" in cli.stdout
    assert run_cli("verify", str(out / "checkpoint-20")).returncode == 0

    # Resume: the highest verified step (20, in the Trainer's own output_dir, whose bytes are the
    # verified copy's), never the rejected 99: it is moved out of the Trainer's way, and said.
    d = _resume_and_finish(info, out / "checkpoint-20", 20)
    a2 = d["attempts"][1]
    assert a2["resume_from"] == str(out / "checkpoint-20") and a2["exit_code"] == 0
    assert not bad.exists() and (out / "checkpoint-99.rejected" / "model.safetensors").is_file()
    aside = [c for c in d["checkpoints"] if c["path"] == str(bad)][-1]
    assert aside["state"] == "rejected" and "moved aside to" in aside["reason"], aside
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert "resuming from True" in log and "train begins at step 20" in log and "done at step 40" in log
    assert (root / "step-000020" / "checkpoint-20").is_dir()  # the verified copy, untouched
    assert json.loads((out / "checkpoint-40" / "trainer_state.json").read_text())["global_step"] == 40


def test_lightning_checkpoints_with_kth_value_inf_verify_and_resume(trhome: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    project = tmp_path / "project"
    shutil.copytree(MAKERS, project)
    args = "lightning_fit.py --dirpath ckpts --max-steps 40 --every 10"
    template = f"{PY} {args} --ckpt_path {{ckpt}}"
    info = _launch(project, template, "ckpts", [sys.executable, *args.split(), "--die-at", "25"])
    ckpts = project / "ckpts"
    d = _dead_with_verified(info, [ckpts / "step=10.ckpt", ckpts / "step=20.ckpt"])
    assert not [f for f in d["findings"] if f["code"] == "CKPT_REJECTED"]  # kth_value = inf is no rejection
    report = next(
        r.report
        for r in _journal(info)
        if isinstance(r, protocol.CheckpointState)
        and r.path == str(ckpts / "step=20.ckpt")
        and r.state == "verified"
    )
    assert any("kth_value" in n and "not weights or optimizer state" in n for n in report.notes)
    copy20 = _root(info) / "step-000020" / "step=20.ckpt"
    assert copy20.is_file() and layout.latest_checkpoint(_root(info)) == copy20

    # A corrupted copy: a NaN in the weights, a name that claims the highest step.
    state = torch.load(ckpts / "step=20.ckpt", weights_only=True)
    state["state_dict"]["head.weight"][3, 3] = float("nan")
    state["global_step"] = 99
    bad = ckpts / "step=99.ckpt"
    torch.save(state, bad)
    f = _rejected(info, bad)
    assert "non-finite values in 1 tensor(s): state_dict.head.weight (1 NaN, 0 Inf)" in f["message"]

    # The trainer's own step=20.ckpt (it holds the verified bytes), never the verified copy;
    # the rejected step=99.ckpt moved out of its way.
    d = _resume_and_finish(info, ckpts / "step=20.ckpt", 20)
    assert (
        d["attempts"][1]["resume_from"] == str(ckpts / "step=20.ckpt") and d["attempts"][1]["exit_code"] == 0
    )
    assert not bad.exists() and (ckpts / "step=99.ckpt.rejected").is_file()
    log = (Path(info.run_dir) / runs.LOG_NAME).read_text()
    assert "train begins at step 20" in log and "done at step 40" in log
    assert (ckpts / "step=40.ckpt").is_file()
