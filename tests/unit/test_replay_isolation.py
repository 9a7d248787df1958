"""A replay beside a live run: where it runs (the device, refused only when sharing the run's GPU
would not fit, with the figures) and its writes kept out of the run's directories (a real overlay
in a real mount namespace, and a real user namespace for a user who is not root)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trainroom.core.ops import isolate
from trainroom.core.ops.replayplace import PlaceError, parse_device, place
from trainroom.core.samples import GpuDevice, GpuProcess, GpuSample
from trainroom.core.sdk.replay import ReplayRequest, replay_env, replay_request
from trainroom.core.wire import protocol as p

GIB = 1 << 30


def _gpu(used: int, held: int | None, device: int = 0, n: int = 2) -> GpuSample:
    devs = [GpuDevice(index=i, used_bytes=used if i == device else 0, total_bytes=80 * GIB) for i in range(n)]
    return GpuSample(
        t=1.0,
        available=True,
        devices=devs,
        processes=[GpuProcess(pid=4242, device=device, used_bytes=held, ours=True)],
    )


def test_a_replay_sharing_the_live_runs_gpu_is_refused_only_when_memory_does_not_allow_it() -> None:
    with pytest.raises(PlaceError) as e:
        place(None, True, _gpu(70 * GIB, 60 * GIB))
    assert str(e.value) == (
        "the replay would share GPU 0 with the live trainer and its memory does not allow it: 10.0 GiB free "
        "of 80.0 GiB, and the run's trainer holds 60.0 GiB there (what a replay of the same command needs): "
        "replay on the CPU (--device cpu), on another GPU (--device N), or once the run has ended"
    )
    fits = place(None, True, _gpu(30 * GIB, 20 * GIB))
    assert fits.device == "cuda:0" and fits.env == {
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    assert fits.words.startswith("on GPU 0 beside the live trainer: 50.0 GiB free of 80.0 GiB")
    other = place(parse_device("1"), True, _gpu(70 * GIB, 60 * GIB))  # not the run's GPU
    assert other.device == "cuda:1" and other.env["CUDA_VISIBLE_DEVICES"] == "1"
    cpu = place(parse_device("cpu"), True, _gpu(70 * GIB, 60 * GIB))
    assert cpu.device == "cpu" and cpu.env == {"CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(PlaceError, match="how much memory it needs is not known"):
        place(None, True, _gpu(70 * GIB, None))  # per-process N/A: never a guess
    with pytest.raises(PlaceError, match="there is no GPU 5: the driver lists 2"):
        place(parse_device("cuda:5"), True, _gpu(1, 1))
    # Ended, or a run with no GPU memory in the driver's view: as the run's command was started.
    assert place(None, False, _gpu(70 * GIB, 60 * GIB)).env == {}
    assert place(None, True, GpuSample(t=1.0, available=False, reason="no NVML")).env == {}
    assert place(parse_device("0"), False, _gpu(70 * GIB, 60 * GIB)).device == "cuda:0"  # ended: no check
    for bad in ("gpu", "-1", "cuda:x", ""):
        with pytest.raises(ValueError, match="give cpu, a GPU index"):
            parse_device(bad)


def test_the_device_travels_to_the_trainer_in_the_request() -> None:
    req = ReplayRequest(step=3, batch=p.BatchRef(index=3, seed=0), ckpt="/c", ckpt_step=2, device="cuda:1")
    back = replay_request(replay_env(req))
    assert back is not None and back.device == "cuda:1"
    plain = replay_request(replay_env(ReplayRequest(step=3, batch=req.batch, ckpt="/c", ckpt_step=2)))
    assert plain is not None and plain.device == ""


def _isolated(
    run: Path, upper: Path, script: str, *, as_nobody: bool = False
) -> subprocess.CompletedProcess[str]:
    # Imports first (the interpreter's own files need not be readable by nobody), then the uid drops.
    code = (
        "import os, sys, locale, gettext, argparse, ctypes; from trainroom.core.ops import isolate\n"
        # ... and the process is dumpable again, as the exec of a user's own process leaves it
        # (a setuid clears it, and /proc/self/uid_map is then root's).
        + (
            "os.setgroups([]); os.setgid(65534); os.setuid(65534); ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n"
            if as_nobody
            else ""
        )
        + f"sys.exit(isolate.main(['--upper', {str(upper)!r}, '--cover', {str(run)!r}, '--', 'sh', '-c', {script!r}]))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(isolate.__file__).parents[3])}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=run, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("as_nobody", [False, True], ids=["this-user", "not-root"])
def test_what_a_replay_writes_into_the_runs_directory_lands_in_its_scratch_directory(
    tmp_path: Path, as_nobody: bool, request: pytest.FixtureRequest
) -> None:
    if as_nobody and os.geteuid() != 0:
        pytest.skip("dropping to another uid needs root; this user's run is the other case")
    if as_nobody:  # pytest's own tmp_path is root's alone: a directory nobody can reach
        tmp_path = Path(tempfile.mkdtemp(prefix="tr-iso-", dir="/tmp"))
        request.addfinalizer(lambda: shutil.rmtree(tmp_path, ignore_errors=True))
    run, upper = tmp_path / "run", tmp_path / "scratch"
    (run / "out").mkdir(parents=True)
    (run / "out" / "ckpt.pt").write_bytes(b"the run's")
    (run / "log.txt").write_text("kept\n")
    upper.mkdir()
    if as_nobody:
        tmp_path.chmod(0o755)
        for f in (run, run / "out", run / "out" / "ckpt.pt", run / "log.txt", upper):
            os.chown(f, 65534, 65534)
    out = _isolated(
        run,
        upper,
        "echo replay > out/ckpt.pt; mkdir -p lightning_logs; echo v > lightning_logs/v0; rm log.txt; "
        "cat out/ckpt.pt; id -u",
        as_nobody=as_nobody,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["replay", "65534" if as_nobody else str(os.geteuid())]
    # The run's directory as it was; the replay's writes beside it in the scratch directory.
    assert (run / "out" / "ckpt.pt").read_bytes() == b"the run's" and (
        run / "log.txt"
    ).read_text() == "kept\n"
    assert sorted(f.name for f in run.iterdir()) == ["log.txt", "out"]
    assert (upper / "upper" / "0" / "out" / "ckpt.pt").read_text() == "replay\n"
    assert (upper / "upper" / "0" / "lightning_logs" / "v0").is_file()


def test_isolation_that_cannot_be_made_says_why_and_runs_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    inner = run / "scratch"  # its writes would land inside what it covers
    inner.mkdir()
    out = _isolated(run, inner, "touch ran")
    assert out.returncode == isolate.CANNOT and not (run / "ran").exists()
    assert (
        out.stderr.strip()
        == f"{isolate.MARK}: the replay's scratch directory {inner} is inside {run}, which it must cover"
    )


def test_covers_are_the_existing_outermost_directories(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    got = isolate.covers(
        [str(tmp_path / "a" / "b"), str(tmp_path / "a"), str(tmp_path / "c"), str(tmp_path / "none")]
    )
    assert got == [tmp_path / "a", tmp_path / "c"]


def test_a_scratch_directory_inside_the_runs_cwd_puts_the_writes_in_the_temp_dir(tmp_path: Path) -> None:
    """A state dir under the run's cwd (TRAINROOM_HOME=./.trainroom): overlayfs takes no upper
    inside its lower, so the writes go to a directory of their own in the temp dir, and still
    never into the run's cwd."""
    run = tmp_path / "run"
    scratch = run / ".trainroom" / "runs" / "r" / "replays" / "x"
    scratch.mkdir(parents=True)
    assert isolate.upper_dir(tmp_path / "elsewhere", [run], "t-") == tmp_path / "elsewhere"
    upper = isolate.upper_dir(scratch / "written", [run], "trainroom-replay-r-")
    try:
        assert upper.parent == Path(os.path.realpath(tempfile.gettempdir())) and upper.name.startswith(
            "trainroom-replay-r-"
        )
        (run / "ckpt.pt").write_bytes(b"the run's")
        out = _isolated(run, upper, "echo replay > ckpt.pt; echo s > .trainroom/runs/r/replays/x/saved")
        assert out.returncode == 0, out.stderr
        assert (run / "ckpt.pt").read_bytes() == b"the run's" and not (scratch / "saved").exists()
        assert (upper / "upper" / "0" / "ckpt.pt").read_text() == "replay\n"
    finally:
        shutil.rmtree(upper, ignore_errors=True)
    assert (
        isolate.upper_dir(scratch / "written", [Path("/")], "t-") == scratch / "written"
    )  # enter() says why
