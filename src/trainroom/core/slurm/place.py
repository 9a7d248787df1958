"""Where a task sits in a Slurm job, from the environment srun gives every task: the job's name
for trainroom (`slurm-<JOBID>`, arrays `slurm-<ARRAY_JOB_ID>_<TASK_ID>`), the node
(SLURMD_NODENAME), the task's rank (SLURM_PROCID) and the attempt (SLURM_RESTART_COUNT: a
requeued job is the same run, one attempt later)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated

import msgspec

_Id = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,12}$")]
_Word = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_.\-\[\],]{1,256}$")]
_Count = Annotated[int, msgspec.Meta(ge=0, le=10_000_000)]


class SlurmPlace(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One task of a Slurm job, as its environment says."""

    job_id: _Id
    array_job_id: _Id | None = None
    array_task_id: _Id | None = None
    step_id: str | None = None  # SLURM_STEP_ID ("0", "batch", ...): None outside a step
    node: _Word | None = None  # SLURMD_NODENAME
    procid: _Count = 0  # SLURM_PROCID: the task's rank in the step
    ntasks: _Count = 1  # SLURM_NTASKS
    localid: _Count = 0  # SLURM_LOCALID: the task's rank on its node
    nodeid: _Count = 0  # SLURM_NODEID: the node's index in the allocation
    nnodes: _Count = 1  # SLURM_NNODES (SLURM_JOB_NUM_NODES)
    restart_count: _Count = 0  # SLURM_RESTART_COUNT: 0 the first time, N after N requeues

    @property
    def job_name(self) -> str:
        """What `trainroom job slurm:JOBID` finds the job's runs by."""
        if self.array_job_id and self.array_task_id:
            return f"slurm-{self.array_job_id}_{self.array_task_id}"
        return f"slurm-{self.job_id}"


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    text = env.get(key, "").strip()
    return int(text) if text.isdigit() else default


def in_step(env: Mapping[str, str]) -> bool:
    """A task of a Slurm step (srun), where a command must stay in the foreground for its life."""
    return bool(env.get("SLURM_JOB_ID", "").strip().isdigit() and env.get("SLURM_STEP_ID", "").strip())


def place_of(env: Mapping[str, str]) -> SlurmPlace | None:
    """This task's place, or None outside a Slurm job (or with an environment that does not parse:
    the run is then launched as any other)."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        return None
    try:
        return msgspec.convert(
            {
                "job_id": job,
                "array_job_id": env.get("SLURM_ARRAY_JOB_ID") or None,
                "array_task_id": env.get("SLURM_ARRAY_TASK_ID") or None,
                "step_id": env.get("SLURM_STEP_ID") or None,
                "node": env.get("SLURMD_NODENAME") or None,
                "procid": _int(env, "SLURM_PROCID", 0),
                "ntasks": _int(env, "SLURM_NTASKS", 1),
                "localid": _int(env, "SLURM_LOCALID", 0),
                "nodeid": _int(env, "SLURM_NODEID", 0),
                "nnodes": _int(env, "SLURM_NNODES", _int(env, "SLURM_JOB_NUM_NODES", 1)),
                "restart_count": _int(env, "SLURM_RESTART_COUNT", 0),
            },
            SlurmPlace,
        )
    except msgspec.ValidationError:
        return None


def is_torchrun(argv: list[str]) -> bool:
    """torchrun, or `python -m torch.distributed.run` (its own launcher: one task per node)."""
    head = [os.path.basename(a) for a in argv[:4]]
    return "torchrun" in head or any(a in ("torch.distributed.run", "torch.distributed.launch") for a in head)


def rank_env(place: SlurmPlace, env: Mapping[str, str], argv: list[str]) -> dict[str, str]:
    """RANK, WORLD_SIZE and LOCAL_RANK for a trainer run one task per rank (`srun -n N python
    train.py`), where torch's env:// rendezvous and the SDK read them and srun sets only SLURM_*.
    Nothing for torchrun (it sets its workers' own) or where they are set already."""
    if is_torchrun(argv):
        return {}
    want = {"RANK": place.procid, "WORLD_SIZE": place.ntasks, "LOCAL_RANK": place.localid}
    return {k: str(v) for k, v in want.items() if k not in env}
