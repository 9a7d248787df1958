"""GPU acceptance: trainroom's driver and allocator paths on a real NVIDIA GPU.

    python scripts/gpu_check.py [--device N] [--python PY] [--json] [--budget-s 270]
    python scripts/gpu_check.py --cpu-rehearsal   # the same flows with a CPU trainer (no GPU)

Each check is PASS, FAIL or SKIP, with its figures:

  nvml_init        NVML init and the first sample (ms), the driver version, the devices
  process_calls    ComputeRunningProcesses _v3, _v2, v1: which the driver has, which the probe uses
  probe_cycle      one probe cycle's cost (GpuProbe.sample: the keeper's NVML calls, once a second)
  bench            the matmul bench's TFLOPS against the device class's floor
  trainer_vram     a real CUDA trainer under a keeper: its per-process memory as the driver lists it
  allocator_ratio  the reporter's allocator view against the driver's: the ratio, no GHOST_MEMORY
  ghost_memory     a second process in the trainer's group holds memory the allocator cannot see:
                   GHOST_MEMORY names that pid and offers its targeted kill
  kill             `kill` of the trainer's group through the keeper: exit 0, VRAM before -> after,
                   released on the basis the keeper names (per-process rows, or the launch floor)
  stale_lock       a stopped straggler keeps the dead trainer's flock: STALE_LOCK names it
  orphan_context   ... and its CUDA context: ORPHAN_CONTEXT names it
  kernel_log, gpu_health, xid_events, power_cap: the GPU's own faults (gpu_check_health.py)
  cleanup          every process the script started is gone

Without NVML the NVML checks skip; without a CUDA device in --python's torch the CUDA checks say
"skipped: no CUDA device". All runs under a private TRAINROOM_HOME, ended on the way out, failure or
not (recorded groups, keepers, then whatever carries that TRAINROOM_HOME). Exit 0: nothing failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import msgspec
import psutil
import pynvml
from gpu_check_health import health_checks
from gpu_check_session import Session

from trainroom.core.configuration.settings import LaunchOptions
from trainroom.core.ops.bench import run_bench
from trainroom.core.ops.doctor import TorchView, nvml_view, probe_cycles, process_call_ladder, torch_view
from trainroom.core.probes.gpu import GpuProbe, load_nvml, pid_namespace
from trainroom.core.run.client import KeeperClient, KeeperGone
from trainroom.core.run.store import RunInfo
from trainroom.core.samples import GpuProcess, GpuSample
from trainroom.core.units import fmt_bytes

ROLES = Path(__file__).resolve().with_name("gpu_check_roles.py")
NO_LIBRARY = str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
PROBE_CYCLE_BOUND_MS = 100.0  # a tenth of the keeper's one-second probe cycle
TRAINER_MIB, GHOST_MIB = 1024, 2048
CUDA_CHECKS = (
    "bench",
    "trainer_vram",
    "allocator_ratio",
    "ghost_memory",
    "kill",
    "stale_lock",
    "orphan_context",
)
MIB = 1 << 20
KILL_TOLERANCE = 512 * MIB  # the keeper's default vram_tolerance

Result = Literal["pass", "fail", "skip"]
Fact = str | int | float | bool | None


class Outcome(msgspec.Struct, kw_only=True):
    name: str
    result: Result
    detail: str
    figures: dict[str, Fact] = {}


class Report(msgspec.Struct, kw_only=True):
    home: str  # the private TRAINROOM_HOME (removed at the end unless --keep-home)
    device: str | None
    driver: str | None
    torch: str | None
    python: str
    seconds: float
    outcomes: list[Outcome]

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.result == "fail"]


def passed(name: str, ok: bool, detail: str, **figures: Fact) -> Outcome:
    return Outcome(name=name, result="pass" if ok else "fail", detail=detail, figures=figures)


def skipped(name: str, why: str, **figures: Fact) -> Outcome:
    return Outcome(name=name, result="skip", detail=f"skipped: {why}", figures=figures)


def start_trainer(s: Session, name: str, device: str) -> tuple[RunInfo, Path]:
    """A gpu_check_roles.py trainer under a keeper, holding TRAINER_MIB on `device` and the flock
    of its own lock file (a configured lock of the run); the control dir it watches."""
    work = s.home / name
    (work / "control").mkdir(parents=True)
    lock = work / "train.lock"
    argv = [s.python, str(ROLES), "trainer", "--device", device, "--mib", str(TRAINER_MIB)]
    argv += ["--lock", str(lock), "--control", str(work / "control"), "--ghost-mib", str(GHOST_MIB)]
    return s.launch(argv, LaunchOptions(lock_files=[str(lock)]), work), work / "control"


# --------------------------------------------------------------------------- NVML


def check_nvml_init(nvml: Any) -> Outcome:
    t0 = time.perf_counter()
    view = nvml_view(nvml)
    ms = (time.perf_counter() - t0) * 1000
    if not view.available:
        if view.reason == NO_LIBRARY:
            return skipped("nvml_init", f"no NVIDIA driver ({view.reason})")
        return passed("nvml_init", False, f"NVML failed: {view.reason}", ms=round(ms, 2))
    names = "; ".join(f"#{d.index} {d.name} {fmt_bytes(d.total_bytes)}" for d in view.devices)
    return passed(
        "nvml_init",
        bool(view.devices),
        f"driver {view.driver_version}; {len(view.devices)} device(s): {names or 'none'}; "
        f"init + first sample {ms:.1f} ms",
        ms=round(ms, 2),
        driver=view.driver_version,
        devices=len(view.devices),
        persistence=",".join(str(d.persistence_mode) for d in view.devices),
        per_process=view.per_process,
        fake=view.fake or None,
    )


def check_process_calls(nvml: Any, index: int) -> Outcome:
    """Each ComputeRunningProcesses variant called on the device, newest first, and what the
    keeper's probe makes of them."""
    probe = GpuProbe(nvml)
    try:
        first = probe.sample()
        if not first.available:
            return skipped("process_calls", f"NVML unavailable ({_reason(first)})")
        try:
            calls = process_call_ladder(probe.nvml, index)
        except Exception as exc:
            return passed("process_calls", False, f"device {index}: {exc}")
        failing = [n for n in probe.sample().notes if "compute processes unavailable" in n]
    finally:
        probe.close()
    uses = next((c.version for c in calls if c.ok), None)
    figures: dict[str, Fact] = {c.version: c.said for c in calls}
    figures["probe_notes"] = "; ".join(failing) or None
    said = ", ".join(f"{c.version} {c.said}" for c in calls)
    verdict = (
        f"the keeper's probe uses {uses}"
        if uses and not failing
        else "; ".join(failing) or "no variant works"
    )
    return passed("process_calls", uses is not None and not failing, f"{said}; {verdict}", **figures)


def _reason(sample: GpuSample) -> str:
    return sample.reason.removeprefix("driver view unavailable: ")


def check_probe_cycle(nvml: Any, cycles: int = 50) -> Outcome:
    probe = GpuProbe(nvml)
    try:
        first = probe.sample(our_pids=[os.getpid()])
        if not first.available:
            return skipped("probe_cycle", f"NVML unavailable ({_reason(first)})")
        times, sample = probe_cycles(probe, cycles)
    finally:
        probe.close()
    times.sort()
    median, p95 = statistics.median(times), times[int(0.95 * (len(times) - 1))]
    listed = len(sample.processes) if sample is not None else 0
    devices = len(sample.devices) if sample is not None else 0
    return passed(
        "probe_cycle",
        median <= PROBE_CYCLE_BOUND_MS,
        f"one probe cycle: median {median:.2f} ms, p95 {p95:.2f} ms, max {times[-1]:.2f} ms over {cycles} "
        f"({devices} device(s), {listed} compute process(es)); bound {PROBE_CYCLE_BOUND_MS:g} ms",
        median_ms=round(median, 3),
        p95_ms=round(p95, 3),
        max_ms=round(times[-1], 3),
        cycles=cycles,
    )


def check_bench(python: str, device: str) -> Outcome:
    result = run_bench(device, python=python, seconds=1.0)
    if not result.ok:
        return passed("bench", False, f"bench on {device}: {result.error}")
    return passed(
        "bench",
        result.verdict == "ok",
        f"{result.device_name}: {result.tflops:.4g} TFLOPS {result.dtype} against the {result.floor_tflops:g} "
        f"floor of its class ({result.device_class})",
        tflops=result.tflops,
        floor_tflops=result.floor_tflops,
        dtype=result.dtype,
        device_class=result.device_class,
    )


# --------------------------------------------------------------------------- the trainer under a keeper


def _finding(code: str, **match: Any) -> Callable[[dict[str, Any]], Any]:
    def pred(d: dict[str, Any]) -> Any:
        for f in d.get("findings") or []:
            if f["code"] == code and all(f["evidence"].get(k) == v for k, v in match.items()):
                return f
        return None

    return pred


def _driver_row(nvml: Any, pid: int) -> GpuProcess | None:
    """The driver's compute-process row for `pid` (None: not listed)."""
    probe = GpuProbe(nvml)
    try:
        sample = probe.sample(our_pids=[pid])
    finally:
        probe.close()
    return next((p for p in sample.processes if p.pid == pid), None)


def trainer_phase(s: Session, nvml: Any, device: str, cpu: bool) -> list[Outcome]:
    info, control = start_trainer(s, "trainer", device)
    up, d = s.wait(
        info, lambda d: (d.get("step") or 0) >= 5 and (cpu or d["vram"]["allocator_reserved_bytes"]), 120
    )
    names = ("trainer_vram", "allocator_ratio", "ghost_memory", "kill")
    if not up:
        why = f"the trainer did not report 5 steps (state {d.get('state')}; see {info.run_dir}/trainer.log)"
        return [passed(n, False, why) for n in names]
    pid = d["pid"]
    out = []
    if cpu:
        out.append(
            skipped(
                "trainer_vram", f"no CUDA device (rehearsal: pid {pid} stepped under a keeper on the CPU)"
            )
        )
        out.append(skipped("allocator_ratio", "no CUDA device"))
    else:
        time.sleep(3.0)  # a window of three probe cycles: GHOST_MEMORY needs two to fire
        out += judge_trainer(nvml, pid, s.wait(info, lambda d: d, 10)[1])
    holder = ghost_step(s, info, control, cpu, out)
    out.append(kill_step(info, [pid] + ([holder] if holder else []), cpu))
    return out


def judge_trainer(nvml: Any, pid: int, d: dict[str, Any]) -> list[Outcome]:
    vram = d["vram"]
    if not vram["driver_available"]:
        why = f"the keeper's {vram['driver_reason']}"
        return [passed("trainer_vram", False, why), passed("allocator_ratio", False, why)]
    row = _driver_row(nvml, pid)
    run_bytes, reserved = vram["driver_run_bytes"], vram["allocator_reserved_bytes"]
    figures: dict[str, Fact] = {
        "pid": pid,
        "listed": row is not None,
        "listed_bytes": row.used_bytes if row else None,
        "pid_namespace": pid_namespace(),
        "driver_run_bytes": run_bytes,
        "driver_used_bytes": vram["driver_used_bytes"],
    }
    if row is None:
        first = passed("trainer_vram", False, f"the driver does not list the trainer's pid {pid}", **figures)
    elif row.used_bytes is None:
        first = passed(
            "trainer_vram", True, f"pid {pid} listed; per-process memory N/A (WSL2/WDDM or MIG)", **figures
        )
    else:
        agree = run_bytes is not None and abs(run_bytes - row.used_bytes) <= 64 * MIB
        first = passed(
            "trainer_vram",
            agree,
            f"the driver attributes {fmt_bytes(row.used_bytes)} to pid {pid}; status says "
            f"{fmt_bytes(run_bytes)} for the run",
            **figures,
        )
    basis = "per-process" if run_bytes is not None else "device"
    driver = run_bytes if run_bytes is not None else vram["driver_used_bytes"]
    ghost = _finding("GHOST_MEMORY")(d)
    ratio = driver / reserved if driver and reserved else None
    second = passed(
        "allocator_ratio",
        ratio is not None and ratio >= 1.0 and ghost is None,
        f"driver {fmt_bytes(driver)} ({basis}) / allocator reserved {fmt_bytes(reserved)} = "
        + (f"{ratio:.2f}x" if ratio else "n/a")
        + f" (allocated {fmt_bytes(vram['allocator_allocated_bytes'])}; the CUDA context's share "
        f"{fmt_bytes(driver - reserved if driver and reserved else None)}); "
        + ("GHOST_MEMORY raised for a healthy trainer" if ghost else "no GHOST_MEMORY"),
        ratio=round(ratio, 3) if ratio else None,
        driver_bytes=driver,
        reserved_bytes=reserved,
        allocated_bytes=vram["allocator_allocated_bytes"],
        basis=basis,
    )
    return [first, second]


def ghost_step(s: Session, info: RunInfo, control: Path, cpu: bool, out: list[Outcome]) -> int | None:
    (control / "ghost").touch()
    holder = s.wait_file(control / "ghost.ready", 90)
    if holder is None:
        out.append(
            passed("ghost_memory", False, f"the holder did not start (see {info.run_dir}/trainer.log)")
        )
        return None
    if cpu:
        out.append(
            skipped("ghost_memory", f"no CUDA device (rehearsal: holder pid {holder} in the trainer's group)")
        )
        return holder
    found, _ = s.wait(info, _finding("GHOST_MEMORY"), 30)
    out.append(judge_ghost(found, holder))
    return holder


def judge_ghost(found: dict[str, Any] | None, holder: int) -> Outcome:
    """GHOST_MEMORY as the product must say it for memory a live process of the run holds: it
    names the holder (its bytes, not a rank), offers the targeted kill of exactly that pid, and
    keeps the driver-side advice for memory no pid explains."""
    if found is None:
        return passed(
            "ghost_memory",
            False,
            f"no GHOST_MEMORY within 30 s of holder pid {holder} taking {GHOST_MIB} MiB",
        )
    ev = found["evidence"]
    named = next((h for h in ev.get("holders") or [] if h.get("pid") == holder), None)
    target = (found.get("target") or {}).get("pids")
    problems = []
    if named is None:
        problems.append(f"holder pid {holder} not named among the holders")
    elif named.get("rank"):
        problems.append(f"holder pid {holder} called a rank")
    if found.get("action") != "kill" or target != [holder]:
        problems.append(f"the kill offered targets {target}, not [{holder}]")
    if "gpu-reset" in found["message"] and not ev.get("unexplained_bytes"):
        problems.append("driver-side advice for memory a pid explains")
    return passed(
        "ghost_memory",
        not problems,
        found["message"] + ("; " + "; ".join(problems) if problems else ""),
        holder_pid=holder,
        holder_bytes=named.get("used_bytes") if named else None,
        driver_bytes=ev.get("driver_bytes"),
        reserved_bytes=ev.get("reserved_bytes"),
        unexplained_bytes=ev.get("unexplained_bytes"),
        ratio=ev.get("ratio"),
        basis=ev.get("basis"),
        cycles=ev.get("cycles"),
    )


def kill_step(info: RunInfo, pids: list[int], cpu: bool) -> Outcome:
    try:
        reply = KeeperClient(info.sock).confirmed("kill", {"grace_s": 5.0}, timeout_s=120)
    except (KeeperGone, OSError) as exc:
        return passed("kill", False, f"the keeper did not answer the kill: {exc}")
    return judge_kill(reply.ok, reply.message, reply.before, reply.after, [p for p in pids if _alive(p)], cpu)


def judge_kill(
    ok: bool, message: str, before: dict[str, Any], after: dict[str, Any], left: list[int], cpu: bool
) -> Outcome:
    """The kill judged as the product judges it: its own verdict (exit 0), nothing of the group
    left, and on a GPU the release said on a named basis (per-process rows, or the floor recorded
    at launch) with what the run holds after under the tolerance, whatever the device's floor."""
    held, basis = after.get("vram_bytes"), after.get("vram_basis")
    released = cpu or (basis is not None and held is not None and held < KILL_TOLERANCE)
    return passed(
        "kill",
        ok and not left and released,
        message + (f"; still alive: {left}" if left else ""),
        vram_before_bytes=before.get("vram_bytes"),
        vram_after_bytes=held,
        vram_basis=basis,
        vram_device_bytes=after.get("vram_device_bytes"),
        vram_floor_bytes=after.get("vram_floor_bytes"),
        vram_wait_s=after.get("vram_wait_s"),
        members=before.get("members"),
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def straggler_phase(s: Session, nvml: Any, device: str, cpu: bool) -> list[Outcome]:
    info, control = start_trainer(s, "straggler", device)
    up, d = s.wait(info, lambda d: (d.get("step") or 0) >= 3, 120)
    if not up:
        why = f"the trainer did not report 3 steps (state {d.get('state')}; see {info.run_dir}/trainer.log)"
        return [passed(n, False, why) for n in ("stale_lock", "orphan_context")]
    trainer = d["pid"]
    (control / "strand").touch()
    spid = s.wait_file(control / "strand.ready", 90)
    dead, _ = s.wait(info, lambda d: d["state"] == "dead", 60)
    if spid is None or not dead:
        why = f"no stopped straggler and dead trainer (see {info.run_dir}/trainer.log)"
        return [passed(n, False, why) for n in ("stale_lock", "orphan_context")]
    lock, _ = s.wait(info, lambda d: _inherited_by(d, spid), 30)
    heir = next((k for k in lock["evidence"]["inheritors"] if k["pid"] == spid), {}) if lock else {}
    out = [
        passed(
            "stale_lock",
            lock is not None and heir.get("state") == "T",
            lock["message"] if lock else f"no STALE_LOCK naming straggler pid {spid} within 30 s",
            trainer_pid=trainer,
            straggler_pid=spid,
            straggler_state=heir.get("state"),
            kill_pids=",".join(map(str, lock["evidence"]["kill_pids"])) if lock else None,
        )
    ]
    if cpu:
        out.append(skipped("orphan_context", f"no CUDA device (rehearsal: straggler pid {spid} stopped)"))
        return out
    row = _driver_row(nvml, spid)
    orphan, _ = s.wait(info, _finding("ORPHAN_CONTEXT", pid=spid), 15)
    held = row.used_bytes if row else None
    for sig in (signal.SIGKILL, signal.SIGCONT):
        try:
            os.kill(spid, sig)
        except OSError:
            pass
    end = time.monotonic() + 30
    while (after := _driver_row(nvml, spid)) is not None and time.monotonic() < end:
        time.sleep(0.2)
    out.append(
        passed(
            "orphan_context",
            orphan is not None,
            (orphan["message"] if orphan else f"no ORPHAN_CONTEXT for straggler pid {spid} within 15 s")
            + f"; the driver listed it with {fmt_bytes(held)} (state {row.state if row else None}); "
            f"after SIGKILL: {'gone' if after is None else fmt_bytes(after['used_bytes'])}",
            straggler_pid=spid,
            listed=row is not None,
            held_bytes=held,
            pid_namespace=pid_namespace(),
            released=after is None,
        )
    )
    return out


def _inherited_by(d: dict[str, Any], pid: int) -> Any:
    for f in d.get("findings") or []:
        if f["code"] == "STALE_LOCK" and pid in [k["pid"] for k in f["evidence"].get("inheritors") or []]:
            return f
    return None


# --------------------------------------------------------------------------- the run


def run_checks(s: Session, args: argparse.Namespace, torch: TorchView, out: list[Outcome]) -> None:
    """Every check in order, appended to `out` as it ends (so a failure midway keeps the rest)."""
    nvml = load_nvml()
    out += [check_nvml_init(nvml), check_process_calls(nvml, args.device), check_probe_cycle(nvml)]
    cuda = torch.cuda_available and args.device < torch.device_count
    out += [Outcome(**o) for o in health_checks(nvml, args.device, s.python, cuda)]
    if not cuda and not args.cpu_rehearsal:
        why = f"no CUDA device (torch {torch.version or 'not importable'} in {torch.python}"
        why += f": {torch.error})" if torch.error else (": a CPU build)" if torch.cuda_build is None else ")")
        out += [skipped(n, why) for n in CUDA_CHECKS]
        return
    device = f"cuda:{args.device}" if cuda else "cpu"
    out.append(check_bench(s.python, device))
    out += trainer_phase(s, nvml, device, cpu=not cuda)
    out += straggler_phase(s, nvml, device, cpu=not cuda)


def render(report: Report) -> list[str]:
    lines = [
        f"gpu_check: {report.device or 'no CUDA device'}, driver {report.driver or 'none'}, "
        f"torch {report.torch or 'none'} in {report.python}; {report.seconds:.1f} s"
    ]
    for o in report.outcomes:
        lines.append(f"{o.result.upper():4}  {o.name:<15} {o.detail}")
        shown = {k: v for k, v in o.figures.items() if v is not None}
        if shown:
            lines.append(" " * 22 + "  ".join(f"{k}={v}" for k, v in shown.items()))
    counts = {r: sum(o.result == r for o in report.outcomes) for r in ("pass", "fail", "skip")}
    lines.append(f"{counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="gpu_check.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", type=int, default=0, help="the CUDA device index (default 0)")
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="an interpreter with trainroom and a CUDA torch (default: this one)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--budget-s", type=float, default=270.0, help="stop waiting after this long (default 270)"
    )
    ap.add_argument("--cpu-rehearsal", action="store_true", help="run the keeper flows with a CPU trainer")
    ap.add_argument(
        "--keep-home", action="store_true", help="keep the private TRAINROOM_HOME (its runs' logs)"
    )
    args = ap.parse_args(argv)
    started = time.monotonic()
    home = Path(tempfile.mkdtemp(prefix="trgpu", dir="/tmp"))  # short: a socket path must fit
    os.environ["TRAINROOM_HOME"] = str(home)
    session = Session(home, args.budget_s, args.python)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the cleanup below runs
    torch = torch_view(args.python)
    outcomes: list[Outcome] = []
    try:
        run_checks(session, args, torch, outcomes)
    except Exception as exc:  # a bug here must still end in the report and the clean-up
        outcomes.append(passed("error", False, f"gpu_check stopped: {type(exc).__name__}: {exc}"))
    finally:
        left = session.cleanup()
        outcomes.append(
            passed(
                "cleanup",
                not left,
                f"{len(session.run_dirs)} run(s) and {len(session.pids)} spawned pid(s) ended"
                + (f"; still alive: {left}" if left else "; nothing left running"),
                left=len(left),
            )
        )
        if not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)
    cuda = torch.cuda_available and args.device < torch.device_count
    nvml = nvml_view()
    report = Report(
        home=str(home),
        device=torch.devices[args.device] if cuda else None,
        driver=nvml.driver_version,
        torch=torch.version,
        python=args.python,
        seconds=round(time.monotonic() - started, 1),
        outcomes=outcomes,
    )
    print(json.dumps(msgspec.to_builtins(report), indent=2) if args.json else "\n".join(render(report)))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
