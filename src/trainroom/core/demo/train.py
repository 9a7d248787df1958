"""The demo trainer: a small char-level transformer on CPU (or on a GPU with `--device cuda[:N]`),
trained for real on the corpus the
project ships, with AdamW, a torch LR scheduler, checkpoints through the SDK, the reporter wired in,
and `--fault NAME` reproducing each failure of docs/scenarios.md for real.

Run it under a keeper with `trainroom demo`, or by hand: `python -m trainroom.core.demo.train`.

`--fault slow`: from --fault-step on, each batch waits SLOW_EXTRA_S more (a data loader gone
slow): SLOW, the steps still coming.

A fault fires in attempt 1 only (a resumed attempt trains on cleanly) unless
`--fault-every-attempt`. The training-sanity faults (scenarios 4-8):
  lr-override    two attempts, as in scenario 4: a fresh attempt plays the earlier run (1e-6, whatever
                 --lr says), saves at --fault-step and ends; resume it and the session (--lr,
                 default 1e-4) restores optimizer + scheduler state without reimpose_lr, so it
                 trains at 1e-6 (--reimpose-lr: the same resume with the helper, the fix)
  exploded-init  lm_head scaled to std 13.87 before the first step
  white-model    lm_head zeroed and frozen: logits 0, loss = ln V exactly, nothing learns
  spike          one poisoned batch (random labels) after --fault-step: a spike, then recovery
  diverge        the LR ramps (x1.05 a step) to 300x --lr: spike, divergence, grad explosion, NaN
  nan            one Linear's weight set to NaN (--tracer names blocks.1.mlp.0)
  rank-outlier   under torchrun, rank 1's loader hands out random labels from --fault-step on
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainroom.core import sdk
from trainroom.core.demo.evaluate import checkpoint_file
from trainroom.core.demo.faults import DIVERGE_LR_FACTOR, EARLIER_RUN_LR, FAULTS, SESSION_LR_AFTER_OVERRIDE
from trainroom.core.demo.model import CharGPT
from trainroom.core.sdk import CheckpointWontFit, NonFiniteTracer, reimpose_lr, save_checkpoint

SLOW_EXTRA_S = 0.4  # --fault slow: what each batch waits on top of the step (>= 3x a demo step)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="trainroom-demo-trainer")
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help="the session's LR (default 3e-3; 1e-4 under --fault lr-override, as in scenario 4)",
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=32)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per step (a slower demo)")
    ap.add_argument("--fault", choices=FAULTS, default="none")
    ap.add_argument("--fault-step", type=int, default=30)
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda[:N]: ghost-memory and orphan-context are then real CUDA processes",
    )
    ap.add_argument(
        "--fault-every-attempt",
        action="store_true",
        help="fault again in resumed attempts too (default: only the first attempt faults)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--tracer", action="store_true", help="name the first module whose output went non-finite"
    )
    ap.add_argument("--lock-file", help="hold an flock on this file while training (as many trainers do)")
    ap.add_argument("--ckpt-pad-mb", type=float, default=0.0, help="pad each checkpoint by this many MiB")
    ap.add_argument(
        "--no-reimpose-lr",
        action="store_true",
        help="on resume, keep the optimizer/scheduler LR from the checkpoint",
    )
    ap.add_argument(
        "--reimpose-lr",
        action="store_true",
        help="on resume, call reimpose_lr even under --fault lr-override (the fix)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.lr is None:
        args.lr = SESSION_LR_AFTER_OVERRIDE if args.fault == "lr-override" else 3e-3
    if os.environ.get("TRAINROOM_DEMO_DUPLICATE"):
        return _be_the_duplicate(int(os.environ["TRAINROOM_DEMO_DUPLICATE"]))
    request = sdk.replay_request()
    if request is not None:
        from trainroom.core.demo.replay import replay

        return replay(DemoRun(args), request)
    return DemoRun(args).train()


class DemoRun:
    """One attempt of the demo: the model, its optimizer and scheduler, the reporter, and the
    fault this attempt plays (before a step, after it, or in how it saves)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.resume = os.environ.get("TRAINROOM_RESUME")
        # lr-override is a story in two attempts (scenario 4): a fresh attempt plays the earlier run,
        # which trains at 1e-6, saves and ends; every resume from it plays the session that asks for
        # --lr and restores optimizer + scheduler state but never calls reimpose_lr. The missing call
        # is a property of the session's code, so it holds in every resumed attempt (unless
        # --reimpose-lr, the fix).
        self.forgets_reimpose = args.fault == "lr-override" and bool(self.resume) and not args.reimpose_lr
        if int(os.environ.get("TRAINROOM_ATTEMPT", "1")) > 1 and not args.fault_every_attempt:
            # A fault is an event, not a property of the run: a resumed attempt trains on cleanly.
            args.fault = "none"
        self.fault = args.fault
        self.earlier_run = args.fault == "lr-override" and not self.resume
        self.session_lr = EARLIER_RUN_LR if self.earlier_run else args.lr
        torch.set_num_threads(1)
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        if self.world > 1:
            import torch.distributed as dist

            dist.init_process_group("gloo")
        # "cuda" alone is the first visible device, named so set_device can take it.
        self.device = torch.device("cuda:0" if args.device == "cuda" else args.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the reporter reads this device's allocator
        torch.manual_seed(args.seed)
        text = resources.files("trainroom.core.demo").joinpath("corpus.txt").read_text()
        chars = sorted(set(text))
        self.vocab = len(chars)
        stoi = {c: i for i, c in enumerate(chars)}
        self.data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
        self.arch = {
            "layers": args.layers,
            "d_model": args.d_model,
            "vocab": self.vocab,
            "heads": args.heads,
            "ctx": args.ctx,
        }
        self.rep = sdk.connect(lr=self.session_lr, vocab_size=self.vocab, warmup_steps=0, arch=self.arch)
        self.model = CharGPT(self.vocab, args.d_model, args.heads, args.layers, args.ctx).to(self.device)
        self.net: nn.Module = self.model
        if self.world > 1:
            self.net = nn.parallel.DistributedDataParallel(self.model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.session_lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1000, gamma=0.5)
        self.step = 0
        self.tokens = 0
        self.gen = torch.Generator().manual_seed(args.seed * 1000 + self.rank)
        self.batch_seed = args.seed * 1000 + self.rank  # this rank's sampler seed (see batch_at)
        self.fake_nvml = os.environ.get("TRAINROOM_FAKE_NVML")
        if self.fake_nvml and self.rank == 0:
            _release_fake_rows_on_sigterm(self.fake_nvml)
        self.ckpt_root = Path(os.environ.get("TRAINROOM_CKPT_ROOT") or "checkpoints")
        self.tracer: NonFiniteTracer | None = None
        self.ghost: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ setup

    def _prepare(self) -> None:
        args, model = self.args, self.model
        if self.fault == "white-model":
            # The plateau at ln V (scenario 6): an output head left at zero and frozen (a fine-tune that
            # forgot to unfreeze it). Its logits are all 0, so every token gets 1/V, the loss is ln V
            # exactly, and no gradient reaches anything below it: the run steps and learns nothing.
            with torch.no_grad():
                model.lm_head.weight.zero_()
            model.lm_head.weight.requires_grad_(False)
        if self.resume:
            self._load(self.resume)
        if self.earlier_run:
            print(
                f"lr-override: this attempt plays the earlier run at lr {EARLIER_RUN_LR:g} (not --lr {args.lr:g}); "
                f"it saves at step {args.fault_step} and ends: resume the run to start the session",
                flush=True,
            )
        if self.fault == "exploded-init":
            with torch.no_grad():
                model.lm_head.weight.mul_(13.87 / float(model.lm_head.weight.std()))
        if args.tracer:
            self.tracer = NonFiniteTracer(model, reporter=self.rep)
        lock_fd = _take_lock(args.lock_file) if args.lock_file else None
        if self.fault == "orphan-context" and lock_fd is not None and self.rank == 0:
            # A child inherits the flock and outlives the trainer: the zombie holding the lock in scenario 10.
            subprocess.Popen(
                [sys.executable, "-c", _holder_code(self.device, ORPHAN_MIB, until_parent_gone=False)],
                pass_fds=(lock_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        if self.fault == "duplicate" and self.rank == 0:
            _start_duplicate()

    def _load(self, resume: str) -> None:
        with self.rep.phase("checkpoint-load"):
            ckpt = torch.load(checkpoint_file(resume), map_location="cpu", weights_only=False)
        self.model.load_state_dict(ckpt["model"])
        self.opt.load_state_dict(ckpt["optimizer"])
        self.sched.load_state_dict(ckpt["scheduler"])
        self.step, self.tokens = int(ckpt["step"]), int(ckpt.get("tokens", 0))
        if "rng" in ckpt:
            torch.set_rng_state(ckpt["rng"]["torch"])
            self.gen.set_state(ckpt["rng"]["sampler"])
        print(f"resumed from {resume} at step {self.step}", flush=True)
        if self.forgets_reimpose or self.args.no_reimpose_lr:
            print(
                f"lr {self.opt.param_groups[0]['lr']:.3g} restored from the checkpoint, "
                f"requested {self.args.lr:g}: reimpose_lr not called",
                flush=True,
            )
        else:
            reimpose_lr(self.opt, self.sched, self.args.lr, step=self.step)

    # ------------------------------------------------------------------ the loop

    def train(self) -> int:
        args = self.args
        self._prepare()
        print(
            f"demo trainer: rank {self.rank}/{self.world} vocab {self.vocab} ln(V) {math.log(self.vocab):.4f} "
            f"lr {self.session_lr:g} fault {self.fault}@{args.fault_step}",
            flush=True,
        )
        start_step = self.step
        while self.step < args.steps:
            x, y = self._batch()
            self._before_step()
            lv, gn, alloc = self._train_step(x, y)
            self.rep.step(
                self.step,
                loss=lv,
                tokens=self.tokens,
                grad_norm=gn,
                optimizer=self.opt,
                alloc=alloc,
                batch={"seed": self.batch_seed, "index": self.step},
            )
            if self.step % 10 == 0 and self.rank == 0:
                print(
                    f"iter {self.step}: loss {lv:.4f}, lr {self.opt.param_groups[0]['lr']:.3e}, grad {gn:.3f}",
                    flush=True,
                )
            self._after_step()
            ends_earlier_run = self.earlier_run and self.step >= args.fault_step
            self._maybe_save(ends_earlier_run, start_step)
            if ends_earlier_run:
                print(
                    f"the earlier run ends at step {self.step} (lr {self.opt.param_groups[0]['lr']:.3g}, saved); "
                    "resume it (R in the control room, or `trainroom resume --yes`) for the session",
                    flush=True,
                )
                break
            if args.step_delay:  # gpu-throttle: a GPU held at its thermal slowdown runs 8x slower
                throttled = self.fault == "gpu-throttle" and self.step >= args.fault_step
                time.sleep(args.step_delay * (8 if throttled else 1))
        self.rep.close("finished")
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
        print(f"done at step {self.step}", flush=True)
        return 0

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        args = self.args
        if self.fault == "stall" and self.step >= args.fault_step:
            _stall(self.net, self.data, args, self.gen, self.device)
        if self.fault == "slow" and self.step >= args.fault_step:
            # A data loader gone slow (a network filesystem, a starved worker): each batch waits
            # SLOW_EXTRA_S, many times the step's own time; steps keep coming, slowly.
            time.sleep(SLOW_EXTRA_S)
        x, y = self.batch_at(self.batch_seed, self.step + 1)
        if self.fault == "rank-outlier" and self.rank == 1 and self.step >= args.fault_step:
            # Scenario 8's rank 41: from the fault step on, one rank's loader hands out corrupt
            # labels (random token ids). Its loss jumps and stays up; averaged with the healthy
            # rank it only moves the mean, so the headline must show the median and the worst.
            y = torch.randint(self.vocab, y.shape, generator=self.gen).to(self.device)
        return x, y

    def batch_at(self, seed: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of one step, from its identity alone (the seed of this rank's sampler and
        the step's index), as a data pipeline with a seeded sampler hands it out: what each step
        reports (`batch=`) and what a replay asks for again. Under --fault spike the batch of the
        step after --fault-step is a poisoned one (its labels are random tokens), as a corrupt
        shard's would be: a one-step loss spike that any replay of that batch shows again."""
        args = self.args
        g = torch.Generator().manual_seed(seed * 1_000_003 + index)
        ix = torch.randint(len(self.data) - args.ctx - 1, (args.batch,), generator=g)
        x = torch.stack([self.data[i : i + args.ctx] for i in ix])
        y = torch.stack([self.data[i + 1 : i + 1 + args.ctx] for i in ix])
        if self.fault == "spike" and index == args.fault_step + 1:
            y = torch.randint(self.vocab, y.shape, generator=g)
        return x.to(self.device), y.to(self.device)

    def _before_step(self) -> None:
        args, step, model = self.args, self.step, self.model
        if self.fault == "nan" and step == args.fault_step:
            with torch.no_grad():
                model.blocks[-1].mlp[0].weight.fill_(float("nan"))
        if self.fault == "diverge" and step >= args.fault_step:
            # An LR pushed past the stable range (a schedule that ramps too far): the loss stops
            # coming back and settles well above its best while staying finite, the divergence
            # that "wait for NaN" misses.
            for g in self.opt.param_groups:
                g["lr"] = min(g["lr"] * 1.05, args.lr * DIVERGE_LR_FACTOR)
        if (
            self.fault == "ghost-memory"
            and (self.device.type == "cuda" or self.fake_nvml)
            and step >= args.fault_step
            and self.rank == 0
            and self.ghost is None
        ):
            # What a DataLoader worker or an async-save child that touched CUDA does: a process of
            # the trainer's group with a context of its own and memory no allocator reports (on the
            # CPU it only sleeps, and the fake driver lists its row).
            self.ghost = subprocess.Popen(
                [sys.executable, "-c", _holder_code(self.device, GHOST_MIB, until_parent_gone=True)],
                stdin=subprocess.DEVNULL,
            )
        if self.tracer is not None:
            self.tracer.step = step + 1  # the step this forward reports as

    def _train_step(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, float, tuple[int, int, int] | None]:
        logits = self.net(x)
        loss = F.cross_entropy(logits.view(-1, self.vocab), y.view(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1e9))
        self.opt.step()
        self.sched.step()
        self.step += 1
        self.tokens += self.args.batch * self.args.ctx * self.world
        alloc = None
        if self.fake_nvml and self.rank == 0:
            ghost = self.ghost.pid if self.ghost is not None and self.ghost.poll() is None else None
            alloc = _drive_fake_nvml(self.fake_nvml, self.args, self.step, os.getpid(), ghost)
        return float(loss.detach()), gn, alloc

    def _after_step(self) -> None:
        at = self.step == self.args.fault_step
        if not at:
            return
        if self.fault in ("silent-death", "orphan-context"):
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif self.fault == "hang-lock":
            lock = threading.Lock()
            lock.acquire()
            lock.acquire()  # the main thread parks here for good; the heartbeat thread goes on
        elif self.fault == "masked-enomem":
            _load_with_masked_enomem()

    def _maybe_save(self, ends_earlier_run: bool, start_step: int) -> None:
        args, step = self.args, self.step
        every = 1 if self.fault == "disk-fill" else args.ckpt_every
        due = ends_earlier_run or bool(every and step % every == 0)
        if self.rank != 0 or not due or step <= start_step:
            return
        state: dict[str, Any] = {
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "step": step,
            "tokens": self.tokens,
            # The generators a faithful resume restores: torch's own and this rank's sampler's.
            "rng": {"torch": torch.get_rng_state(), "sampler": self.gen.get_state()},
            "config": {"lr": self.session_lr, "vocab_size": self.vocab, **self.arch},
        }
        pad = args.ckpt_pad_mb or (8.0 if self.fault == "disk-fill" else 0.0)
        if pad:
            state["pad"] = torch.zeros(int(pad * (1 << 20) / 4))
        _save(
            state, step, self.ckpt_root, truncate=self.fault == "truncated-ckpt" and step >= args.fault_step
        )


def _save(state: dict[str, Any], step: int, root: Path, truncate: bool) -> None:
    if not truncate:
        try:
            save_checkpoint(state, step, root=root)
        except CheckpointWontFit as exc:
            # The pre-save check refused before writing a byte: skip this checkpoint and train
            # on (the keeper shows DISK_HIGH / DISK_FULL_SOON, with the saves skipped, which
            # save_checkpoint told it of; a prune makes room again).
            print(f"checkpoint step {step} skipped: {exc.strerror}", flush=True)
        return
    # DrvFs as scenario 12 saw it: the file lands short, nothing says so, and the trainer moves on.
    import io

    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()[: len(buf.getvalue()) // 2]
    q = root / ".quarantine"
    q.mkdir(parents=True, exist_ok=True)
    path = q / f"step-{step:06d}.pt"
    rep = sdk.current()
    with rep.phase("checkpoint-save"), open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    rep.checkpoint(str(path), step, size_bytes=len(data), digest=None)


def _stall(
    net: nn.Module, data: torch.Tensor, args: argparse.Namespace, gen: torch.Generator, device: torch.device
) -> None:
    """Scenario 2: after a resume the accumulation counter never meets its multiple, so the
    loop keeps computing micro-batches and never steps. Alive, busy, no progress."""
    micro = 1
    accum = 16
    while True:
        ix = torch.randint(len(data) - args.ctx - 1, (args.batch,), generator=gen)
        x = torch.stack([data[i : i + args.ctx] for i in ix]).to(device)
        with torch.no_grad():
            net(x)
        micro += accum  # wrong increment: micro % accum never returns to 0
        if micro % accum == 0:
            return
        time.sleep(0.01)


def _load_with_masked_enomem() -> None:
    """torch.load under host memory pressure, as scenario 13 saw it: SystemError hides ENOMEM."""
    try:
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    except OSError as exc:
        raise SystemError("readinto") from exc


def _take_lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.set_inheritable(fd, True)
    return fd


def _start_duplicate() -> None:
    """A second instance of the same command in the same directory, outside our process group
    (a session that was not released). It watches us and leaves when we are gone."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINROOM_") or k == "TRAINROOM_HOME"}
    env["TRAINROOM_DEMO_DUPLICATE"] = str(os.getpid())
    # Exactly our command line, so the process table shows two identical trainers. Started through
    # an intermediate that exits at once, so it is not our descendant either (the duplicate check
    # rightly counts our own children, e.g. data-loader workers, as ours): an unreleased session's
    # trainer is no child of the new one.
    launcher = (
        "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, "
        "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    subprocess.run(
        [sys.executable, "-c", launcher, *sys.orig_argv],
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _be_the_duplicate(parent: int) -> int:
    """The second instance idles (as a forgotten session would) and leaves when we are gone."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(parent, 0)
        except OSError:
            return 0


# What the GPU faults hold on a real device: the ghost 2 GiB (GHOST_MEMORY needs 1 GiB over the
# allocator), the orphan a little (its context is what the driver lists).
GHOST_MIB = 2048
ORPHAN_MIB = 64
# On the CPU, the fake driver's device and the dead context of the orphan-context fault.
FAKE_DEVICE_BYTES = 12 << 30
FAKE_ORPHAN_BYTES = 7 << 30


def _holder_code(device: torch.device, mib: int, *, until_parent_gone: bool) -> str:
    """A child's program: on the CPU it only sleeps (the fake driver plays its rows); on a GPU
    it makes its own CUDA context and holds `mib` there, until its parent is gone or for an hour."""
    hold = ""
    if device.type == "cuda":
        hold = (
            f"import torch; torch.cuda.set_device({device.index or 0}); "
            f"x = torch.ones({mib} * 262144, device='cuda'); torch.cuda.synchronize(); "
        )
    if until_parent_gone:
        return hold + "import os, time\np = os.getppid()\nwhile os.getppid() == p: time.sleep(0.5)"
    return hold + "import time; time.sleep(3600)"


def _release_fake_rows_on_sigterm(path: str) -> None:
    """A real driver frees a context when its process exits; the fake frees nothing by itself.
    So a trainer that drives it and is asked to stop (a user's kill) takes its own rows out
    first, then dies of the signal as it would have. A SIGKILL leaves them: a dead trainer's
    context is what the orphan-context fault shows."""

    def on_term(signum: int, _frame: object) -> None:
        try:
            with open(path) as f:
                scenario = json.load(f)
            mine = os.getpid()
            rows = [r for r in scenario.get("processes") or [] if r.get("pid") != mine]
            freed = sum(int(r.get("used_bytes") or 0) for r in scenario.get("processes") or []) - sum(
                int(r.get("used_bytes") or 0) for r in rows
            )
            scenario["processes"] = rows
            for dev in scenario.get("devices") or []:
                dev["used_bytes"] = max(0, int(dev.get("used_bytes", 0)) - freed)
                dev["util_percent"] = 0
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(scenario, f)
            os.replace(tmp, path)
        except (OSError, ValueError):
            pass
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)


def _drive_fake_nvml(
    path: str, args: argparse.Namespace, step: int, pid: int, ghost: int | None = None
) -> tuple[int, int, int]:
    """On a machine without a GPU, the ghost-memory and orphan-context faults drive the fake NVML:
    the allocator view the reporter sends and the driver view the keeper's fake reads agree except
    where the fault says they must not. `ghost`: the live child of the ghost-memory fault, listed
    with the memory that brings the run to 2.1x its allocator's reserve."""
    reserved = 4 << 30
    allocated = 3 << 30
    own = reserved + (300 << 20)  # the trainer's row: its reserve and its context
    procs = [{"pid": pid, "used_bytes": own}]
    if ghost is not None:
        procs.append({"pid": ghost, "used_bytes": int(reserved * 2.1) - own})
    util, power = 85, 160.0
    if args.fault == "orphan-context" and step >= args.fault_step - 1:
        # What the dead context holds fits beside the trainer's row on the device, as on a real
        # one: the driver never lists more in use than the device has.
        procs.append({"pid": 4_194_000 + (pid % 1000), "used_bytes": FAKE_ORPHAN_BYTES})
        util, power = 100, 60.0
    try:  # what the trainer does not drive (a test's bus id, health figures, events) is kept
        with open(path) as f:
            kept = json.load(f)
        dev = dict((kept.get("devices") or [{}])[0])
    except (OSError, ValueError, AttributeError, IndexError, TypeError):
        kept, dev = {}, {}
    dev.update(name=dev.get("name", "NVIDIA GeForce RTX 3060 (fake)"), total_bytes=FAKE_DEVICE_BYTES)
    dev.update(used_bytes=sum(p["used_bytes"] for p in procs), util_percent=util, power_w=power)
    if args.fault == "gpu-throttle" and step >= args.fault_step:  # hot: thermal slowdown at 91 °C
        dev.update(clock_reasons=0x20 | 0x40, temp_c=91, temp_slowdown_c=87, temp_shutdown_c=92)
    scenario = {**kept, "devices": [dev], "processes": procs}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(scenario, f)
    os.replace(tmp, path)
    return allocated, reserved, reserved


if __name__ == "__main__":
    sys.exit(main())
