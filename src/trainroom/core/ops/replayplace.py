"""Where a replay runs while its run still trains: the device (`--device cpu` / a GPU index, or the
run's own), refused only when it would share a GPU with the live trainer and that GPU's free
memory cannot take a second copy of what the trainer holds there. The figures come from the run
keeper's newest driver view (NVML), so the refusal says them.

The replay is told its device through the environment: `CUDA_VISIBLE_DEVICES` (empty for the CPU,
one physical index otherwise, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so CUDA's index 0 is that NVML
index); `sdk.replay_request().device` says the same in words ("cpu" or "cuda:N").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainroom.core.samples import GpuSample
from trainroom.core.units import fmt_bytes


class PlaceError(Exception):
    """A replay that may not run where it would: the message says why, with the figures."""


@dataclass(frozen=True)
class Placement:
    device: str | None  # "cpu", "cuda:N", or None: as the run's command was started
    env: dict[str, str] = field(default_factory=dict)
    words: str = ""  # where it runs and why, for the person


def parse_device(text: str) -> str:
    """`cpu`, `N` or `cuda:N` as "cpu" / "cuda:N"; ValueError otherwise."""
    t = text.strip().lower()
    if t == "cpu":
        return "cpu"
    idx = t.removeprefix("cuda:")
    if not idx.isdigit():
        raise ValueError(f"--device {text!r}: give cpu, a GPU index (0) or cuda:N")
    return f"cuda:{int(idx)}"


def _env_for(device: str) -> dict[str, str]:
    if device == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {"CUDA_VISIBLE_DEVICES": device.removeprefix("cuda:"), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def place(asked: str | None, live: bool, gpu: GpuSample | None) -> Placement:
    """Where the replay runs. `asked`: parse_device's answer or None; `live`: the run still trains;
    `gpu`: the keeper's newest driver view of the run (None or unavailable: no driver view)."""
    if asked == "cpu":
        return Placement("cpu", _env_for("cpu"), "on the CPU (CUDA_VISIBLE_DEVICES empty), as asked")
    view = gpu if gpu is not None and gpu.available else None
    ours = view.ours if view is not None else []
    run_gpus = sorted({x.device for x in ours})
    if asked is None:
        if not live or not run_gpus:
            why = "the run has ended" if not live else "the run holds no GPU memory the driver shows"
            return Placement(None, {}, f"as the run's command was started ({why})")
        target = run_gpus[0]
    else:
        target = int(asked.removeprefix("cuda:"))
    device = f"cuda:{target}"
    if view is not None and not any(d.index == target for d in view.devices):
        raise PlaceError(f"there is no GPU {target}: the driver lists {len(view.devices)}")
    if not live or target not in run_gpus:
        return Placement(device, _env_for(device), f"on GPU {target}" + (", as asked" if asked else ""))
    # It would share a GPU with the live trainer: it needs about what the trainer holds there.
    dev = next(d for d in view.devices if d.index == target) if view is not None else None
    held = [x.used_bytes for x in ours if x.device == target]
    if any(h is None for h in held) or dev is None or dev.total_bytes is None or dev.used_bytes is None:
        raise PlaceError(
            f"the replay would share GPU {target} with the live trainer, and how much memory it needs "
            "is not known (the driver gives no per-process or device figure): replay on the CPU "
            "(--device cpu), on another GPU (--device N), or once the run has ended"
        )
    need = max(h for h in held if h is not None)
    free = dev.total_bytes - dev.used_bytes
    figures = (
        f"{fmt_bytes(free)} free of {fmt_bytes(dev.total_bytes)}, and the run's trainer holds "
        f"{fmt_bytes(need)} there (what a replay of the same command needs)"
    )
    if free < need:
        raise PlaceError(
            f"the replay would share GPU {target} with the live trainer and its memory does not allow it: "
            f"{figures}: replay on the CPU (--device cpu), on another GPU (--device N), or once the run has ended"
        )
    return Placement(device, _env_for(device), f"on GPU {target} beside the live trainer: {figures}")
