"""What a trainer reads when `trainroom replay` starts it: the step to replay, its batch, the
batches of the steps between the checkpoint and it, the checkpoint, and whether to run in fp32.

    req = sdk.replay_request()          # None in an ordinary run
    if req is not None:
        load(req.ckpt)                   # the last verified checkpoint before req.step
        for s in range(req.ckpt_step + 1, req.step):
            train_one(batch_for(req.batches.get(s)))   # the same path to the step, where known
        loss = forward(batch_for(req.batch), fp32=req.fp32)
        sdk.replay_result(loss)          # prints `replay_loss=...`, which replay reads
        sys.exit(0)

The values travel in the environment (TRAINROOM_REPLAY_*, TRAINROOM_RESUME), so the trainer's own
command line is untouched."""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from trainroom.core.wire import protocol as p

ENV_STEP = "TRAINROOM_REPLAY_STEP"
ENV_BATCH = "TRAINROOM_REPLAY_BATCH"
ENV_BATCHES = "TRAINROOM_REPLAY_BATCHES"
ENV_FROM_STEP = "TRAINROOM_REPLAY_FROM_STEP"
ENV_FP32 = "TRAINROOM_REPLAY_FP32"
ENV_CKPT = "TRAINROOM_RESUME"
# The replay's own checkpoint root (a scratch directory `trainroom replay` made): `save_checkpoint`
# in a replayed trainer saves there whatever root it names, so a replay never promotes into the
# run it replays nor moves its `latest`.
ENV_ROOT = "TRAINROOM_REPLAY_ROOT"
# Where `trainroom replay` placed it: "cpu" or "cuda:N" (CUDA_VISIBLE_DEVICES says the same to
# torch); unset: as the run's command was started.
ENV_DEVICE = "TRAINROOM_REPLAY_DEVICE"
# The run it replays: that run's keeper does not take the replay for a duplicate of its trainer.
ENV_OF = "TRAINROOM_REPLAY_OF"


class ReplayRequest(msgspec.Struct, kw_only=True, frozen=True):
    step: int  # the step whose batch is replayed
    batch: p.BatchRef
    ckpt: str  # the checkpoint to start from
    ckpt_step: int  # its step
    batches: dict[int, p.BatchRef] = {}  # step -> batch for the steps between, where known
    fp32: bool = False
    scratch_root: str = ""  # where the replayed trainer's saves go (ENV_ROOT)
    device: str = ""  # "cpu" or "cuda:N" where replay placed it; "": as the run was started


def replay_env(req: ReplayRequest) -> dict[str, str]:
    """The environment a replayed trainer is started with: its saves go to the scratch root, the
    checkpoint root a keeper would name (TRAINROOM_CKPT_ROOT) included."""
    scratch = (
        {ENV_ROOT: req.scratch_root, "TRAINROOM_CKPT_ROOT": req.scratch_root} if req.scratch_root else {}
    )
    return {
        **scratch,
        ENV_STEP: str(req.step),
        ENV_BATCH: msgspec.json.encode(req.batch).decode(),
        ENV_BATCHES: msgspec.json.encode([[s, b] for s, b in sorted(req.batches.items())]).decode(),
        ENV_FROM_STEP: str(req.ckpt_step),
        ENV_FP32: "1" if req.fp32 else "0",
        ENV_CKPT: req.ckpt,
        **({ENV_DEVICE: req.device} if req.device else {}),
    }


def replay_request(env: Mapping[str, str] | None = None) -> ReplayRequest | None:
    """The replay this process was started for; None in an ordinary run."""
    e = os.environ if env is None else env
    if ENV_STEP not in e or ENV_BATCH not in e:
        return None
    rows = msgspec.json.decode(e.get(ENV_BATCHES) or "[]", type=list[tuple[int, p.BatchRef]])
    return ReplayRequest(
        step=int(e[ENV_STEP]),
        batch=msgspec.json.decode(e[ENV_BATCH], type=p.BatchRef),
        ckpt=e.get(ENV_CKPT, ""),
        ckpt_step=int(e.get(ENV_FROM_STEP) or 0),
        batches=dict(rows),
        fp32=e.get(ENV_FP32) == "1",
        scratch_root=e.get(ENV_ROOT, ""),
        device=e.get(ENV_DEVICE, ""),
    )


def in_replay(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by `trainroom replay`."""
    return ENV_STEP in (os.environ if env is None else env)


def scratch_root(env: Mapping[str, str] | None = None) -> str | None:
    """The root a replayed trainer's saves go to; None outside a replay."""
    e = os.environ if env is None else env
    return e.get(ENV_ROOT) or None if in_replay(e) else None


def replay_result(loss: float) -> None:
    """Say the replayed batch's loss the way `trainroom replay` reads it."""
    print(f"replay_loss={float(loss)!r}", flush=True)
