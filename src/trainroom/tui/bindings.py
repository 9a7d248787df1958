"""Every key of the control room: one `Binding` each, with an id (remappable through
`App.set_keymap`) and a tooltip (the help screen and the command palette show it)."""

from __future__ import annotations

from textual.binding import Binding

# Actions the keeper carries out, by name (the protocol's `Request.action`).
KEEPER_ACTIONS = ("kill", "reclaim", "prune", "resume", "dump", "verify", "bench")
# These change the world: the plan is shown in a confirmation first.
DESTRUCTIVE = frozenset({"kill", "reclaim", "prune", "resume"})

BINDINGS: list[Binding] = [
    Binding(
        "k",
        "kill",
        "kill",
        id="trainroom.kill",
        tooltip="Kill the trainer's process group (SIGTERM, then SIGKILL) and confirm VRAM fell",
    ),
    Binding(
        "c",
        "reclaim",
        "reclaim",
        id="trainroom.reclaim",
        tooltip="Reclaim the host page cache (cgroup memory.reclaim or drop_caches)",
    ),
    Binding(
        "p",
        "prune",
        "prune",
        id="trainroom.prune",
        tooltip="Prune checkpoints, keeping the last verified ones, pinned and latest",
    ),
    Binding(
        "r",
        "resume",
        "resume",
        id="trainroom.resume",
        tooltip="Resume from the last verified checkpoint as a new attempt",
    ),
    Binding(
        "d",
        "dump",
        "dump",
        id="trainroom.dump",
        tooltip="Dump the trainer's stacks (faulthandler, or py-spy when uninstrumented)",
    ),
    Binding(
        "v",
        "verify",
        "verify",
        id="trainroom.verify",
        tooltip="Verify the latest checkpoint (digest, NaN/Inf, shapes, outlier std)",
    ),
    Binding(
        "b",
        "bench",
        "bench",
        id="trainroom.bench",
        tooltip="Run the matmul bench on the run's device: is the hardware fine?",
    ),
    # Off the footer (80 columns hold the rest); still in the help screen and the palette.
    Binding("t", "next_theme", "theme", show=False, id="trainroom.theme", tooltip="Switch to the next theme"),
    Binding(
        "question_mark",
        "help",
        "help",
        key_display="?",
        id="trainroom.help",
        tooltip="Show every key, what it does and whether it applies now",
    ),
    Binding(
        "q",
        "quit",
        "quit",
        id="trainroom.quit",
        tooltip="Close the control room (the run and its keeper go on)",
    ),
]
