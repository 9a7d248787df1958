"""A real Slurm (Debian's slurm-wlm 22.05) on this one host for the Slurm tests: munged (when none
runs), slurmctld and two `slurmd -N n1|n2` (fake nodes on ports of their own), all with a config,
state, spool, pid files and logs in a private dir. Clients find it through SLURM_CONF. Stopped by
the pids this fixture started, each checked against /proc/PID/comm first.

Skipped with one line where it cannot start: not root, no slurmctld/slurmd/munged, or a daemon
refusing (its log's last line is the reason). Fast failure settings (SlurmdTimeout=30, KillWait=5)
as a test cluster needs; production defaults are 300 and 30."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

NODES = ("n1", "n2")
CTLD_PORT, SLURMD_PORTS = 16817, {"n1": 17001, "n2": 17002}
BINARIES = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "scontrol", "squeue")


@dataclass
class Slurm:
    dir: Path
    conf: Path
    env: dict[str, str]
    started: dict[str, int] = field(default_factory=dict)  # name -> pid this fixture started
    ports: dict[str, int] = field(default_factory=dict)  # "slurmctld", "n1", "n2" -> its port

    def run(self, *argv: str, timeout: float = 30.0, check: bool = True) -> str:
        out = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
        return out.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o JOBID` as key=value (empty once the job is purged)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        d: dict[str, str] = {}
        for word in out.split():
            k, _, v = word.partition("=")
            d.setdefault(k, v)
        return d

    def node_pids(self, node: str, task_pid: int) -> list[int]:
        """What losing `node` kills: the slurmd this fixture started for it and the slurmstepd
        that is an ancestor of `task_pid` (a task on that node)."""
        pids = [self.started[f"slurmd-{node}"]]
        cur = task_pid
        for _ in range(16):
            cur = _ppid(cur)
            if cur <= 1:
                break
            if _alive(cur, "slurmstepd"):
                pids.append(cur)
        return pids

    def restart_slurmd(self, node: str) -> None:
        """Start `node`'s slurmd again (after a test killed it) and return the node to service."""
        pid_file = self.dir / f"slurmd-{node}.pid"
        pid_file.unlink(missing_ok=True)
        # Without a test's TRAINROOM_* (submit() adds its home to `env`): its teardown kills every
        # process with that home in its environment, and this slurmd outlives the test.
        env = {k: v for k, v in self.env.items() if not k.startswith("TRAINROOM_")}
        subprocess.run(
            ["/usr/sbin/slurmd", "-f", str(self.conf), "-N", node], env=env, check=True, timeout=30
        )
        if not _wait(lambda: _pid_in(pid_file), 10):
            raise AssertionError(
                f"slurmd {node} did not start again: {_why(self.dir / f'slurmd-{node}.log')}"
            )
        self.started[f"slurmd-{node}"] = _pid_in(pid_file) or 0

        def idle() -> bool:
            state = self.run("sinfo", "-h", "-N", "-n", node, "-o", "%T", check=False).strip()
            if state != "idle":
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            return state == "idle"

        if not _wait(idle, 90):
            raise AssertionError(f"node {node} did not return to service after its slurmd restarted")


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _pids_named(comm: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == comm:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _alive(pid: int, comm: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == comm
    except OSError:
        return False


def _wait(pred, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _conf(d: Path, host: str, ports: dict[str, int]) -> str:
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[n]} CPUs=1 "
        "RealMemory=1000 State=UNKNOWN"
        for n in NODES
    )
    return f"""ClusterName=trtest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports["slurmctld"]}
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={d}/ctld
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
Waittime=0
{nodes}
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


def _taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ports() -> dict[str, int]:
    """The usual ports, or (another engineer's or CI job's cluster on this host holds one of them)
    ports the kernel has free now: two clusters then run side by side, each on its own ports."""
    usual = {"slurmctld": CTLD_PORT, **SLURMD_PORTS}
    if not any(_taken(port) for port in usual.values()):
        return usual
    socks = [socket.socket() for _ in usual]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return {name: int(s.getsockname()[1]) for name, s in zip(usual, socks, strict=True)}
    finally:
        for s in socks:
            s.close()


def _pid_in(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _why(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return f"no log at {log}"
    return lines[-1] if lines else "no output"


def start() -> Slurm:
    """Bring the cluster up (about 8 s) or skip with the reason."""
    if os.geteuid() != 0:
        pytest.skip("Slurm tests need root (slurmd runs jobs as their user)")
    missing = [b for b in BINARIES if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
    if missing:
        pytest.skip(
            f"Slurm is not installed here (missing: {', '.join(missing)}; .ci/run installs slurm-wlm)"
        )
    ports = _ports()
    d = Path(tempfile.mkdtemp(prefix="slurm", dir="/tmp"))
    for sub in ("ctld", "spool/n1", "spool/n2"):
        (d / sub).mkdir(parents=True)
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, host, ports))
    (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    for k in [
        k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) and k != "SLURM_CONF"
    ]:
        env.pop(k)
    s = Slurm(dir=d, conf=conf, env=env, ports=ports)
    try:
        _start_munged(s)
        subprocess.run(["/usr/sbin/slurmctld", "-f", str(conf)], env=env, check=True, timeout=30)
        if not _wait(lambda: _pid_in(d / "slurmctld.pid"), 10):
            raise RuntimeError(f"slurmctld did not start: {_why(d / 'slurmctld.log')}")
        s.started["slurmctld"] = _pid_in(d / "slurmctld.pid") or 0
        if not _wait(lambda: "UP" in s.run("scontrol", "ping", check=False), 15):
            raise RuntimeError(f"slurmctld does not answer: {_why(d / 'slurmctld.log')}")
        for n in NODES:
            subprocess.run(["/usr/sbin/slurmd", "-f", str(conf), "-N", n], env=env, check=True, timeout=30)
            pid_file = d / f"slurmd-{n}.pid"
            if not _wait(lambda: _pid_in(pid_file), 10):  # noqa: B023
                raise RuntimeError(f"slurmd {n} did not start: {_why(d / f'slurmd-{n}.log')}")
            s.started[f"slurmd-{n}"] = _pid_in(pid_file) or 0

        def idle() -> bool:
            states = s.run("sinfo", "-h", "-N", "-o", "%T", check=False).split()
            return len(states) == len(NODES) and all(st == "idle" for st in states)

        if not _wait(idle, 30):
            raise RuntimeError(f"nodes not idle: {s.run('sinfo', '-h', '-N', check=False).strip()}")
    except (RuntimeError, ValueError, subprocess.SubprocessError, OSError) as exc:
        stop(s)
        pytest.skip(f"Slurm could not start here: {exc}")
    return s


def _start_munged(s: Slurm) -> None:
    if any(_alive(pid, "munged") for pid in _pids_named("munged")):
        return
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True, timeout=30)
    if not _wait(lambda: _pid_in(Path("/run/munge/munged.pid")), 10):
        raise RuntimeError("munged did not start")
    s.started["munged"] = _pid_in(Path("/run/munge/munged.pid")) or 0


def stop(s: Slurm) -> None:
    """Stop exactly what `start` started (slurmd first, munged last)."""
    order = sorted(s.started, key=lambda n: (not n.startswith("slurmd"), n == "munged"))
    comms = {"slurmctld": "slurmctld", "munged": "munged"}
    for name in order:
        pid = s.started[name]
        comm = comms.get(name, "slurmd")
        if not _alive(pid, comm):
            continue
        os.kill(pid, signal.SIGTERM)
        if not _wait(lambda: not _alive(pid, comm), 10):  # noqa: B023
            os.kill(pid, signal.SIGKILL)
    # slurmstepds of our nodes end with their steps; any left serve only this cluster's jobs.
    for pid in _pids_named("slurmstepd"):
        if str(s.dir) in _environ(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    shutil.rmtree(s.dir, ignore_errors=True)


def _environ(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def cluster() -> Iterator[Slurm]:
    s = start()
    try:
        yield s
    finally:
        stop(s)
