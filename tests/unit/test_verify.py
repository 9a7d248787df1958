"""The verifier on real checkpoints written by real torch: what passes, what is rejected and why."""

from __future__ import annotations

import argparse
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.support.ckpt_fixtures import GPT, NotAllowed, flip_byte_in, nanogpt_checkpoint
from trainroom.core.ckpt import verify as v
from trainroom.core.ckpt.digest import digest_file
from trainroom.core.ckpt.formats import translate_load_error
from trainroom.core.ckpt.report import Expected, NonFinite, Previous, VerifyReport
from trainroom.core.ckpt.rules import findings_for_report, rejected_finding
from trainroom.core.ckpt.verifier import WarmVerifier, verify_in_subprocess
from trainroom.core.health.crash import masked_error
from trainroom.core.health.host import host_ram_low
from trainroom.core.wire.protocol import error_chain


@pytest.fixture
def nanogpt(tmp_path: Path) -> tuple[Path, GPT]:
    state, model = nanogpt_checkpoint()
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    return path, model


def test_nanogpt_checkpoint_verifies(nanogpt: tuple[Path, GPT]) -> None:
    path, model = nanogpt
    rep = v.verify(path, Expected(arch={"n_layer": 2, "n_embd": 32, "vocab_size": 96}))
    assert rep.ok, rep.reason
    assert rep.reason is None and rep.problems == []
    sd = model.state_dict()
    n_opt = sum(
        torch.is_tensor(x)
        for st in torch.load(path, weights_only=True)["optimizer"]["state"].values()
        for x in st.values()
    )
    # best_val_loss is a tensor too, as in nanoGPT.
    assert rep.tensors == len(sd) + n_opt + 1
    # Tied wte/lm_head count once, as nanoGPT's get_num_params does.
    assert rep.params == sum(p.numel() for p in model.parameters())
    assert rep.arch.layers == 2 and rep.arch.d_model == 32 and rep.arch.vocab == 96
    assert rep.step == 300
    assert rep.dtypes == {"float32": rep.tensors}
    assert rep.nonfinite == {} and rep.outliers == [] and rep.arch_mismatch == []
    assert rep.digest == digest_file(path) and rep.digest.startswith("xxh3-128:")
    assert rep.model_key == "model"
    assert 0.015 < rep.stds["transformer.h.0.attn.c_attn.weight"] < 0.025


def test_padded_vocab_matches_declared(tmp_path: Path) -> None:
    # nanoGPT pads GPT-2's 50257 to 50304; 96 is 90 padded to a multiple of 8.
    state, _ = nanogpt_checkpoint()
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    assert v.verify(path, Expected(arch={"vocab_size": 90})).ok
    rep = v.verify(path, Expected(arch={"vocab_size": 120}))
    assert not rep.ok and rep.arch_mismatch[0].field == "vocab"


def test_truncated_and_empty_are_rejected_as_truncated(nanogpt: tuple[Path, GPT], tmp_path: Path) -> None:
    path, _ = nanogpt
    data = path.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) * 2 // 3])
    rep = v.verify(cut)
    assert not rep.ok and rep.reason.startswith("truncated"), rep.reason
    assert "central directory" in rep.reason
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    rep = v.verify(empty)
    assert not rep.ok and rep.reason == "truncated: empty file (0 bytes)"
    # The size recorded at save time names the shortfall even before the load.
    rep = v.verify(cut, Expected(size_bytes=len(data)))
    assert rep.reason == f"truncated: {len(data) * 2 // 3} of {len(data)} bytes on disk"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_tensor_is_named(tmp_path: Path, bad: float) -> None:
    state, _ = nanogpt_checkpoint()
    w = state["model"]["transformer.h.1.mlp.c_fc.weight"]
    w[3, :5] = bad
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    rep = v.verify(path)
    assert not rep.ok
    name = "model.transformer.h.1.mlp.c_fc.weight"
    kind = "nan" if bad != bad else "inf"
    assert rep.nonfinite == {name: NonFinite(nan=5 if kind == "nan" else 0, inf=5 if kind == "inf" else 0)}
    assert name in rep.reason and rep.reason.startswith("non-finite")
    # The std is taken over the finite values: still the healthy init scale.
    assert 0.01 < rep.stds["transformer.h.1.mlp.c_fc.weight"] < 0.03


def test_exploded_lm_head_is_caught(tmp_path: Path) -> None:
    # Scenario 5: a "best" checkpoint whose lm_head had std 13.87.
    state, _ = nanogpt_checkpoint(tied=False)
    head = state["model"]["lm_head.weight"]
    head.normal_(0.0, 13.87)
    path = tmp_path / "best.pt"
    torch.save(state, path)
    rep = v.verify(path)
    assert not rep.ok
    top = rep.outliers[0]
    assert top.name == "lm_head.weight" and top.kind == "exploded"
    assert abs(top.std - 13.87) < 0.5
    assert top.median_std is not None and top.median_std < 0.05
    assert rep.reason.startswith("exploded tensor: lm_head.weight std 13.")


def test_std_growth_against_previous_is_caught(tmp_path: Path) -> None:
    state, _ = nanogpt_checkpoint()
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    first = v.verify(path)
    state["model"]["transformer.h.0.mlp.c_proj.weight"].mul_(
        300.0
    )  # std ~0.01 -> ~3: under the absolute bound
    torch.save(state, path)
    rep = v.verify(path, Expected(previous=Previous(arch=first.arch, stds=first.stds)))
    assert not rep.ok
    assert rep.outliers[0].name == "transformer.h.0.mlp.c_proj.weight"
    assert "grew" in rep.outliers[0].why


def test_architecture_change_is_caught(tmp_path: Path) -> None:
    state2, _ = nanogpt_checkpoint(n_layer=2)
    p2 = tmp_path / "two.pt"
    torch.save(state2, p2)
    prev = v.verify(p2)
    state3, _ = nanogpt_checkpoint(n_layer=3)
    state3["model_args"]["n_layer"] = 3
    p3 = tmp_path / "three.pt"
    torch.save(state3, p3)
    rep = v.verify(p3, Expected(previous=Previous(arch=prev.arch), arch={"n_layer": 2}))
    assert not rep.ok
    fields = {(m.field, m.against) for m in rep.arch_mismatch}
    assert (
        ("layers", "previous") in fields
        and ("layers", "declared") in fields
        and ("params", "previous") in fields
    )
    assert rep.reason.startswith("architecture changed: layers 2 -> 3")
    # The file's own model_args disagreeing with its tensors is caught too.
    state3["model_args"]["n_layer"] = 4
    torch.save(state3, p3)
    rep = v.verify(p3)
    assert [m.against for m in rep.arch_mismatch] == ["in-file config"]


def test_one_flipped_byte_loads_but_the_digest_and_the_crc_catch_it(nanogpt: tuple[Path, GPT]) -> None:
    path, model = nanogpt
    recorded = digest_file(path)
    weight = model.state_dict()["transformer.h.1.mlp.c_fc.weight"]
    flip_byte_in(path, weight.numpy().tobytes())
    torch.load(path, weights_only=True)  # loads without any error
    rep = v.verify(path, Expected(digest=recorded))
    assert not rep.ok and rep.digest_ok is False
    # The archive's CRC-32 of each storage names the tensor; the digest says the file changed.
    name = "model.transformer.h.1.mlp.c_fc.weight"
    assert rep.reason.startswith(f"corrupt: {name}: the tensor's bytes do not match"), rep.reason
    assert any(x.startswith("digest mismatch") for x in rep.problems[1:])
    assert rep.tensors > 0  # still inventoried: the bytes load, they are just not the saved ones
    # Without a recorded digest (a watched file) the CRC alone rejects it, naming the tensor.
    rep = v.verify(path, discover=False)
    assert not rep.ok and rep.digest_ok is None and name in str(rep.reason)


def test_allowed_plain_types_and_a_refused_type_named(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy", reason="numpy scalars in a checkpoint need numpy")
    state, _ = nanogpt_checkpoint()
    state["args"] = argparse.Namespace(lr=6e-4, out_dir=Path("out"))
    state["best_val_loss"] = np.float64(2.81)
    ok = tmp_path / "ok.pt"
    torch.save(state, ok)
    rep = v.verify(ok)
    assert rep.ok, rep.reason
    state["extra"] = NotAllowed()
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    rep = v.verify(bad)
    assert not rep.ok
    assert rep.refused_types == ["tests.support.ckpt_fixtures.NotAllowed"]
    assert "tests.support.ckpt_fixtures.NotAllowed" in rep.reason


def test_safetensors_verify_and_truncate(tmp_path: Path) -> None:
    _, model = nanogpt_checkpoint(tied=False)
    path = tmp_path / "model.safetensors"
    save_file(model.state_dict(), str(path))
    rep = v.verify(path)
    assert rep.ok and rep.format == "safetensors"
    assert rep.arch.layers == 2 and rep.arch.vocab == 96
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    rep = v.verify(path)
    assert not rep.ok and rep.reason.startswith("truncated"), rep.reason


def test_legacy_format_loads_without_mmap(tmp_path: Path) -> None:
    state, _ = nanogpt_checkpoint()
    path = tmp_path / "legacy.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    rep = v.verify(path)
    assert rep.ok and rep.format == "torch-legacy"


def test_legacy_load_deferred_when_host_ram_is_short(tmp_path: Path) -> None:
    state, _ = nanogpt_checkpoint()
    path = tmp_path / "legacy.pt"
    torch.save(state, path, _use_new_zipfile_serialization=False)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:     100000 kB\n")
    rep = v.verify(path, meminfo_path=str(meminfo))
    assert not rep.ok and rep.deferred and rep.reason.startswith("not verified yet: host RAM")
    assert rejected_finding(rep) is None  # the host's fault, not the checkpoint's


def test_masked_error_unwraps_to_the_innermost_errno() -> None:
    def readinto() -> None:
        try:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        except OSError as exc:
            raise SystemError("<built-in method readinto> returned a result with an exception set") from exc

    with pytest.raises(SystemError) as ei:
        readinto()
    chain = error_chain(ei.value)
    f = masked_error(chain)
    assert f is not None and f.code == "MASKED_ERROR" and f.action == "reclaim"
    assert f.evidence["inner"]["errno_name"] == "ENOMEM"
    assert "hides `OSError: [Errno 12] Cannot allocate memory (ENOMEM)`" in f.message
    assert translate_load_error(chain, 10).startswith("out of memory while loading")
    assert masked_error(chain[:1]) is None


def test_host_ram_low_before_a_load() -> None:
    need = v.load_need_bytes(3_900_000_000)
    f = host_ram_low(2_000_000_000, need, "step-000300.pt")
    assert f is not None and f.code == "HOST_RAM_LOW" and f.severity == "critical" and f.action == "reclaim"
    assert "1.9 GiB available" in f.message and "4.1 GiB" in f.message  # 2.0 GB and 4.4 GB
    assert host_ram_low(8_000_000_000, need, "x") is None
    assert host_ram_low(3_500_000_000, 1_000_000_000, "x", floor_bytes=3 << 30) is None
    assert host_ram_low(2_500_000_000, 1_000_000_000, "x", floor_bytes=3 << 30) is not None
    assert v.read_meminfo()["MemAvailable"] > 0


def test_findings_for_a_rejected_report(tmp_path: Path) -> None:
    p = tmp_path / ".quarantine" / "step-000300.pt"
    p.parent.mkdir()
    p.write_bytes(b"PK\x03\x04 not really")
    rep = v.verify(p)
    fs = findings_for_report(rep)
    assert [f.code for f in fs] == ["CKPT_REJECTED"]
    assert fs[0].key == str(p) and "stays in quarantine" in fs[0].message


def test_cli_and_subprocess(nanogpt: tuple[Path, GPT], tmp_path: Path) -> None:
    path, _ = nanogpt
    out = verify_in_subprocess(path, Expected(arch={"n_layer": 2}), timeout=120)
    assert out.ok and out.arch.layers == 2
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[:1000])
    cp = subprocess.run(
        [sys.executable, "-m", "trainroom.core.ckpt", str(cut)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 1
    assert json.loads(cp.stdout)["reason"].startswith("truncated")
    cp = subprocess.run(
        [sys.executable, "-m", "trainroom.core.ckpt", str(tmp_path / "nope.pt")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 2 and "no such file" in cp.stderr and "Traceback" not in cp.stderr
    cp = subprocess.run(
        [sys.executable, "-m", "trainroom.core.ckpt", str(path), "--expect-json", "{"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cp.returncode == 2 and "not JSON" in cp.stderr
    gone = verify_in_subprocess(tmp_path / "nope.pt", timeout=120)
    assert not gone.ok and "no such file" in gone.reason


def test_keeper_side_imports_no_torch() -> None:
    code = (
        "import sys; import trainroom.core.ckpt.verify, trainroom.core.ckpt.layout, trainroom.core.ops.prune, "
        "trainroom.core.health.diskguard, trainroom.core.ckpt.watch, trainroom.core.ckpt.verifier, "
        "trainroom.core.ckpt.promote, trainroom.core.ckpt.rules, trainroom.core.cli.ckpt; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_warm_verifier_reused_restarted_after_a_death_and_on_a_timeout(
    nanogpt: tuple[Path, GPT], tmp_path: Path
) -> None:
    import os
    import signal
    import threading

    from tests.support.waiting import wait_for

    path, _ = nanogpt
    w = WarmVerifier(nice=0, idle_s=60)
    try:
        first = w.verify(path, Expected(arch={"n_layer": 2}))
        pid = w.pid
        second = w.verify(path)
        assert first.ok and second.ok and second.digest == first.digest
        assert w.pid == pid and w.starts == 1 and w.served == 2  # one process, torch imported once
        assert not w.verify(tmp_path / "nope.pt").deferred  # a bad file is a verdict, not a death
        # A FIFO that never gets a byte blocks the child's read: it dies mid-verification, or
        # times out. (Held open here for writing, so the child's open returns and its read waits.)
        fifo = tmp_path / "stuck.pt"
        os.mkfifo(fifo)
        writer = os.open(fifo, os.O_RDWR)
        out: dict[str, VerifyReport] = {}
        t = threading.Thread(target=lambda: out.update(rep=w.verify(fifo, timeout=120)))
        t.start()

        def opened_fifo() -> bool:
            fds = Path(f"/proc/{pid}/fd")
            return any(os.readlink(fd) == str(fifo) for fd in fds.iterdir() if fd.is_symlink())

        wait_for(opened_fifo, timeout=30, what="the verifier blocked opening the FIFO")
        os.kill(pid, signal.SIGKILL)
        t.join(60)
        rep = out["rep"]
        assert not rep.ok and rep.deferred and "killed by SIGKILL" in rep.reason
        assert w.pid is None
        rep = w.verify(fifo, timeout=1.0)
        assert rep.deferred and "timed out after 1 s" in rep.reason and w.pid is None
        again = w.verify(path)  # a fresh child after each death
        assert again.ok and w.starts == 3 and w.pid not in (None, pid)
        # Idle long enough: closed, so a quiet run holds no torch.
        assert not w.close_if_idle()
        assert w.close_if_idle(now=10**9) and w.pid is None
        os.close(writer)
    finally:
        w.close()


def test_warm_verifier_keeps_torch_out_of_the_caller(nanogpt: tuple[Path, GPT]) -> None:
    path, _ = nanogpt
    code = (
        "import sys; from trainroom.core.ckpt.verifier import WarmVerifier; w = WarmVerifier(); "
        f"r = w.verify({str(path)!r}); w.close(); assert r.ok, r; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_verify_verb_on_a_file_a_step_dir_and_a_root(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support.ckpt_fixtures import small_state
    from trainroom.core.cli import ckpt as cli
    from trainroom.core.sdk.save import save_checkpoint

    def verb(*argv: str) -> int:
        ap = argparse.ArgumentParser(prog="trainroom")
        cli.add_parser(ap.add_subparsers())
        args = ap.parse_args(["verify", *argv])
        return int(args.func(args))

    saved = save_checkpoint(small_state(7), 7, root=tmp_path)
    assert saved.promoted is not None and saved.file is not None
    assert verb(saved.file, "--json") == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["ok"] and rep["digest_ok"] is True and rep["path"] == saved.file
    # A step directory stands for its file, a root for its `latest`: the same report.
    for target in (saved.promoted, str(tmp_path)):
        assert verb(target, "--json") == 0
        assert json.loads(capsys.readouterr().out)["path"] == saved.file
    assert verb(saved.file) == 0
    text = capsys.readouterr().out
    assert text.startswith("OK ") and "digest matches the one recorded at save time" in text
    assert "tensors 2 (float32 2)" in text
    cut = tmp_path / "cut.pt"
    cut.write_bytes(Path(saved.file).read_bytes()[:1000])
    assert verb(str(cut)) == 1
    text = capsys.readouterr().out
    assert text.startswith("REJECTED ") and "reason: truncated" in text
    assert verb(saved.file, "--expect-json", "[1]") == 2
    assert "must be a JSON object" in capsys.readouterr().err
    assert verb(str(tmp_path / "nope.pt")) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "plain").mkdir()
    assert verb(str(tmp_path / "plain")) == 2
    assert "neither a checkpoint (a step directory" in capsys.readouterr().err
