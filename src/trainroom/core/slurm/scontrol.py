"""What slurmctld says of a job and its nodes, read from `scontrol show job -o` and `scontrol show
node -o`: the one-line `key=value` form every release since 2.x prints (the `--json` shapes
change between 23.02, 23.11 and 24.x, and 22.05 has none for scontrol). Unknown keys are kept,
missing ones read None, and a value that does not parse is None, never a crash.

`SlurmReader` asks slurmctld at most once per job (and once per node set) every `min_interval_s`
(3 s): however many screens and refreshes read the job, slurmctld sees one RPC per interval."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# A space followed by `Key=`: where the next field starts (values may hold spaces: Command,
# Reason of a node, WorkDir).
_FIELD = re.compile(r" (?=[A-Za-z][A-Za-z0-9_:/.]*=)")
_HOSTLIST = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")
MAX_LINE = 1 << 16
MAX_HOSTS = 100_000
QUERY_TIMEOUT_S = 5.0
MIN_INTERVAL_S = 3.0

Runner = Callable[[Sequence[str]], tuple[int, str, str]]


def fields(line: str) -> dict[str, str]:
    """`K1=v1 K2=v 2 ...` as a dict (the first of a repeated key wins); linear in the line."""
    out: dict[str, str] = {}
    for part in _FIELD.split(line[:MAX_LINE].strip()):
        key, sep, value = part.partition("=")
        if sep and key not in out:
            out[key] = value.strip()
    return out


def duration_s(text: str | None) -> float | None:
    """Slurm's `[days-]hh:mm:ss`, `mm:ss` or `mm` in seconds; None for UNLIMITED, N/A, INVALID."""
    if not text:
        return None
    days = 0
    rest = text
    if "-" in text:
        d, _, rest = text.partition("-")
        if not d.isdigit():
            return None
        days = int(d)
    parts = rest.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        return None
    nums = [int(p) for p in parts]
    with_days = "-" in text
    if len(nums) == 1:
        secs = nums[0] * (3600 if with_days else 60)
    elif len(nums) == 2:
        secs = nums[0] * 3600 + nums[1] * 60 if with_days else nums[0] * 60 + nums[1]
    else:
        secs = nums[0] * 3600 + nums[1] * 60 + nums[2]
    return float(days * 86400 + secs)


def hostnames(hostlist: str | None) -> list[str]:
    """`n[1-3,7],gpu01` as names (what `scontrol show hostnames` prints), without a Slurm call.
    Zero padding is kept (`n[01-03]`); a list that does not parse is returned as one name."""
    if not hostlist or hostlist in ("(null)", "None"):
        return []
    out: list[str] = []
    # Split on the commas outside brackets.
    parts, depth, cur = [], 0, ""
    for ch in hostlist:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for part in parts:
        m = _HOSTLIST.fullmatch(part)
        if m is None:
            return [hostlist]
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for r in ranges.split(","):
            lo, sep, hi = r.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                return [hostlist]
            width = len(lo)
            for i in range(int(lo), int(hi if sep else lo) + 1):
                out.append(f"{prefix}{i:0{width}d}")
                if len(out) > MAX_HOSTS:
                    return out
    return out


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


@dataclass(frozen=True)
class JobInfo:
    """One job as slurmctld said it (`scontrol show job -o`)."""

    job_id: str
    state: str  # RUNNING, PENDING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, ...
    reason: str | None
    nodes: list[str]
    node_list: str | None
    batch_host: str | None
    restarts: int | None
    time_limit_s: float | None  # None: UNLIMITED
    run_time_s: float | None
    exit_code: str | None  # "rc:signal"
    derived_exit_code: str | None
    name: str | None
    user: str | None
    array_job_id: str | None
    array_task_id: str | None
    requeue: bool | None
    eligible_time: str | None
    command: str | None
    work_dir: str | None
    raw: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def time_left_s(self) -> float | None:
        if self.time_limit_s is None or self.run_time_s is None:
            return None
        return max(0.0, self.time_limit_s - self.run_time_s)

    @property
    def ended(self) -> bool:
        return self.state not in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED")

    @classmethod
    def parse(cls, line: str) -> JobInfo | None:
        f = fields(line)
        job_id = f.get("JobId")
        if not job_id:
            return None
        node_list = f.get("NodeList")
        array_task = f.get("ArrayTaskId")
        reason = f.get("Reason")
        return cls(
            job_id=job_id,
            state=(f.get("JobState") or "UNKNOWN").split()[0],
            reason=None if reason in (None, "None", "(null)") else reason,
            nodes=hostnames(node_list),
            node_list=None if node_list in (None, "(null)") else node_list,
            batch_host=f.get("BatchHost"),
            restarts=_int(f.get("Restarts")),
            time_limit_s=duration_s(f.get("TimeLimit")),
            run_time_s=duration_s(f.get("RunTime")),
            exit_code=f.get("ExitCode"),
            derived_exit_code=f.get("DerivedExitCode"),
            name=f.get("JobName"),
            user=(f.get("UserId") or "").split("(")[0] or None,
            array_job_id=f.get("ArrayJobId"),
            array_task_id=array_task,
            requeue=f.get("Requeue") == "1" if "Requeue" in f else None,
            eligible_time=f.get("EligibleTime"),
            command=f.get("Command"),
            work_dir=f.get("WorkDir"),
            raw=f,
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": self.reason,
            "nodes": self.nodes,
            "restarts": self.restarts,
            "time_limit_s": self.time_limit_s,
            "run_time_s": self.run_time_s,
            "time_left_s": self.time_left_s,
            "exit_code": self.exit_code,
            "derived_exit_code": self.derived_exit_code,
            "eligible_time": self.eligible_time,
        }


@dataclass(frozen=True)
class NodeInfo:
    """One node as slurmctld said it (`scontrol show node -o`): State is e.g. IDLE, ALLOCATED,
    MIXED, DOWN*, IDLE+DRAIN; Reason why it is down or drained."""

    name: str
    state: str
    reason: str | None
    addr: str | None = None  # NodeAddr: where its slurmd listens
    port: int | None = None  # Port (slurmd's; SlurmdPort, 6818, when scontrol shows none)

    @property
    def down(self) -> bool:
        words = set(self.state.replace("*", "+NOT_RESPONDING").split("+"))
        return bool(words & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"})

    @classmethod
    def parse(cls, line: str) -> NodeInfo | None:
        f = fields(line)
        name = f.get("NodeName")
        if not name:
            return None
        reason = f.get("Reason")
        return cls(
            name=name,
            state=f.get("State", "UNKNOWN"),
            reason=reason or None,
            addr=f.get("NodeAddr") or None,
            port=_int(f.get("Port")),
        )

    def as_dict(self) -> dict[str, object]:
        return {"node": self.name, "state": self.state, "reason": self.reason, "down": self.down}


class SlurmError(RuntimeError):
    """scontrol could not answer (not installed, slurmctld down, timed out): one line."""


def run_command(argv: Sequence[str]) -> tuple[int, str, str]:
    try:
        out = subprocess.run(list(argv), capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found (is Slurm installed on this host?)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:3])}: no answer within {QUERY_TIMEOUT_S:.0f} s") from None
    return out.returncode, out.stdout, out.stderr


class SlurmReader:
    """scontrol, cached: one query per job id (and per node set) per `min_interval_s`."""

    def __init__(
        self,
        runner: Runner = run_command,
        min_interval_s: float = MIN_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner, self.min_interval_s, self.clock = runner, min_interval_s, clock
        self.calls = 0  # the Slurm queries made (the benchmark counts them)
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], tuple[float, object]] = {}

    def _ask(self, argv: tuple[str, ...]) -> str:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(argv)
            if hit is not None and now - hit[0] < self.min_interval_s:
                cached = hit[1]
                if isinstance(cached, SlurmError):
                    raise cached
                assert isinstance(cached, str)
                return cached
            self.calls += 1
            try:
                rc, out, err = self.runner(argv)
                if rc != 0:
                    raise SlurmError(
                        f"{' '.join(argv[:3])}: {(err.strip() or out.strip() or f'exit {rc}')[:300]}"
                    )
            except SlurmError as exc:
                self._cache[argv] = (now, exc)
                raise
            self._cache[argv] = (now, out)
            return out

    def jobs(self, job_id: str) -> list[JobInfo]:
        """Every line slurmctld has for JOBID (an array: one per task); [] when it knows none
        (purged after MinJobAge)."""
        try:
            out = self._ask(("scontrol", "show", "job", "-o", job_id))
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return []
            raise
        return [j for j in (JobInfo.parse(line) for line in out.splitlines()) if j is not None]

    def job(self, job_id: str) -> JobInfo | None:
        found = self.jobs(job_id)
        exact = [j for j in found if j.job_id == job_id]
        pick = exact or found
        return pick[0] if pick else None

    def nodes(self, names: Sequence[str]) -> dict[str, NodeInfo]:
        if not names:
            return {}
        out = self._ask(("scontrol", "show", "node", "-o", ",".join(names)))
        infos = (NodeInfo.parse(line) for line in out.splitlines())
        return {n.name: n for n in infos if n is not None}

    def newest_job_of(self, user: str) -> str | None:
        """My newest job still known to slurmctld (`squeue --me` order by submit time)."""
        out = self._ask(("squeue", "-h", "-u", user, "-t", "all", "-o", "%i %V", "--sort=-V"))
        for line in out.splitlines():
            job = line.split()[0] if line.split() else ""
            if job:
                return job.split("_")[0] if job.count("_") and "[" in job else job
        return None


def exit_words(code: str | None) -> str | None:
    """`rc:signal` in words: `0:9` is "killed by signal 9 (SIGKILL)"."""
    if not code or ":" not in code:
        return None
    rc, _, sig = code.partition(":")
    if not rc.isdigit() or not sig.isdigit():
        return None
    if int(sig):
        import signal as _signal

        try:
            name = _signal.Signals(int(sig)).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by signal {sig} ({name})"
    return f"exit status {rc}"
