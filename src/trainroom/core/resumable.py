"""What a checkpoint holds of what a faithful resume needs, as a record every layer reads.

A resume is faithful when it carries on the run as if it had never stopped: the model, the
optimizer's state (Adam's moments), the LR scheduler's position, the fp16 loss scaler, the RNG
states (torch, CUDA, numpy, python), the data position (sampler epoch, batches seen, a loader's
state) and the step counters. The config and the code revision help reproduce it. The verifier
reads which of these a checkpoint holds from what it already loads (`ckpt.completeness`); the
record travels in the verification report, the journal's checkpoint records and the manifest.

`losses` says, for a resume from a checkpoint, what each missing part costs the run: the resume
plan's lines.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

PartName = Literal["model", "optimizer", "scheduler", "scaler", "rng", "data", "step", "config", "code"]
PARTS: tuple[PartName, ...] = get_args(PartName)
# What a resume carries on with; config and code only help reproduce the run.
RESUME_PARTS: tuple[PartName, ...] = ("model", "optimizer", "scheduler", "scaler", "rng", "data", "step")
# The checkpoint table's column: short marks, in this order.
MARKS: dict[PartName, str] = {
    "model": "model",
    "optimizer": "opt",
    "scheduler": "sched",
    "rng": "rng",
    "data": "data",
}


class Part(msgspec.Struct, kw_only=True, frozen=True):
    """One part as the checkpoint holds it: `seen` says what was read ("AdamW moments for 28
    params"), or for an absent part what stands in for it, if anything."""

    present: bool = False
    seen: str = ""


class Completeness(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """Every part looked for, present or absent. The loss scaler is listed only where one was
    found (a run without fp16 has none to lose)."""

    parts: dict[str, Part] = {}

    def holds(self, name: str) -> bool:
        part = self.parts.get(name)
        return part is not None and part.present

    def held(self) -> list[str]:
        return [n for n in PARTS if self.holds(n)]

    def lacks(self) -> list[str]:
        return [n for n in PARTS if n in self.parts and not self.parts[n].present]

    def marks(self) -> str:
        """The table's column: "model opt sched rng data", a missing part as "-opt"."""
        return " ".join(m if self.holds(n) else f"-{m}" for n, m in MARKS.items())

    def as_json(self) -> dict[str, object]:
        """`status --json`'s form: what it holds and lacks, the table's marks, each part as seen."""
        return {
            "holds": self.held(),
            "lacks": self.lacks(),
            "marks": self.marks(),
            "parts": {n: {"present": p.present, "seen": p.seen or None} for n, p in self.parts.items()},
        }

    def lines(self) -> list[str]:
        """One line a part, for people: `optimizer: AdamW moments for 28 params`."""
        out = []
        for n in PARTS:
            part = self.parts.get(n)
            if part is None:
                continue
            what = part.seen or ("held" if part.present else "")
            out.append(f"{n}: {what}" if part.present else f"{n}: absent" + (f" ({what})" if what else ""))
        return out


def part_losses(c: Completeness, *, step: int | None = None, fp16: bool = False) -> dict[PartName, str]:
    """What a resume from a checkpoint holding `c` loses or resets, a line a missing part, in the
    order a person weighs them. `step`: the checkpoint's step (the batches seen again); `fp16`:
    the run keeps a loss scale, so a missing scaler is a loss too."""
    out: dict[PartName, str] = {}
    if "model" in c.parts and not c.holds("model"):
        out["model"] = "model weights absent: nothing to resume from but the initialisation"
    if "optimizer" in c.parts and not c.holds("optimizer"):
        out["optimizer"] = (
            "optimizer moments reset: Adam restarts cold (no optimizer state in the checkpoint)"
        )
    if "scheduler" in c.parts and not c.holds("scheduler"):
        out["scheduler"] = "scheduler absent: the LR restarts at warm-up"
    if fp16 and not c.holds("scaler"):
        out["scaler"] = "loss scaler absent: the fp16 loss scale restarts at its initial value"
    if "data" in c.parts and not c.holds("data"):
        seen = f"batches 0–{step} seen again" if step else "the data starts over from its first batch"
        why = c.parts["data"].seen
        out["data"] = f"data position absent: {seen}" + (f" ({why})" if why else "")
    if "rng" in c.parts and not c.holds("rng"):
        out["rng"] = "RNG absent: a different data order and dropout from here on"
    if "step" in c.parts and not c.holds("step"):
        out["step"] = "step counter absent: the trainer counts from 0 again"
    return out


def losses(c: Completeness, *, step: int | None = None, fp16: bool = False) -> list[str]:
    """`part_losses`' lines: the resume plan's "lost" lines."""
    return list(part_losses(c, step=step, fp16=fp16).values())
