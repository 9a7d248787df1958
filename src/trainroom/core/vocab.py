"""Every closed set of words trainroom speaks, once: run states, checkpoint states and kinds,
severities, panels, and the finding catalogue with the groups read off it.

Each set is a `Literal`, so mypy rejects a misspelt state, code or kind wherever one is written;
where code iterates a set, the tuple beside it is the Literal's own arguments. The catalogue says
of each finding code what every reader needs to know about it (how bad it gets, the panel it
colours, whether its figures move while it lasts, whether it is alerted as a run state), and the
groups the watchdog, the sanity tracker, the alerts and the control room use are computed from it,
so a new code is one catalogue line (`python scripts/findings_table.py --write` then writes it into
the `FindingCode` Literal and the docs' table).

It depends on nothing but the standard library: every layer may read it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

# --------------------------------------------------------------------------- run states

# What the watchdog judges a run to be (`RunStatus.state` while a keeper watches it).
WatchState = Literal["starting", "running", "slow", "stalled", "hung", "dead", "stopped", "exited"]
# What a run's journal says it is: a watchdog verdict, or `failed` when it never started (the
# launch recorded why, and no keeper ever ran).
StateName = Literal[WatchState, "failed"]
# What a reader says of a run no keeper watches: `unknown` when the keeper died before its trainer
# (nobody saw the end), `orphaned` when that trainer still runs with no keeper watching it.
Unwatched = Literal["unknown", "orphaned"]
# What a reader shows of a run: its state, or what it is with no keeper watching it.
ShownState = Literal[StateName, Unwatched]
# A node of a job, as the job view says it: what its host shows, or that its host cannot be asked.
NodeState = Literal[ShownState, "unreachable"]
# The states a run alerts on (`[notify] states`) and the states a finding is alerted as.
AlertState = Literal["dead", "hung", "stalled", "exited"]

WATCH_STATES: tuple[WatchState, ...] = get_args(WatchState)
STATE_NAMES: tuple[StateName, ...] = get_args(StateName)
SHOWN_STATES: tuple[ShownState, ...] = get_args(ShownState)
NODE_STATES: tuple[NodeState, ...] = get_args(NodeState)
ALERT_STATES: tuple[AlertState, ...] = get_args(AlertState)

# A run's keeper, as a client that dials it says (`run.client`, the bridge's hello, a job's node).
KeeperWord = Literal["alive", "busy", "gone"]

# --------------------------------------------------------------------------- the trainer's reports

# A phase a reporter announces (`reporter.phase("eval")`).
PhaseName = Literal["train", "eval", "checkpoint-save", "checkpoint-load", "data"]
# Where a step's figures came from: the reporter, or the trainer's log lines.
StepSource = Literal["reporter", "log"]
# What a log step's pace was read from (the trainer's own timing on its lines: core/logs/logtiming).
RateSource = Literal["iteration times", "bar rate", "timestamps"]
# How a rank's end was learnt: its zombie's wait status, its launcher's word, or its pid gone.
WorkerEndSource = Literal["wait-status", "launcher", "gone"]
# What a mark on the loss plot stands for.
MarkKind = Literal["checkpoint", "restart", "lr-change", "loss-scale"]
# A mark on the control room's loss plot: the series' marks, and where a loss was not finite.
LossMark = Literal[MarkKind, "nonfinite"]
# What an event of `trainroom events` is.
EventKind = Literal[
    "finding",
    "finding-cleared",
    "state",
    "action",
    "attempt-started",
    "attempt-ended",
    "alert",
    "keeper-started",
]

# --------------------------------------------------------------------------- the host

# The memory cgroup's version (/proc/self/cgroup).
CgroupVersion = Literal[1, 2]
# Whose pids NVML reports: the host's, a container's own, or not known.
PidNamespace = Literal["host", "container", "unknown"]
# What a duplicate is: another trainer of the run, or a second instance of a host process.
DuplicateKind = Literal["trainer", "host"]
# What the driver's VRAM figure for the run rests on: its processes' own figures, the device's
# use above the floor seen before the run, or the whole device.
VramBasis = Literal["per-process", "floor", "device"]

# --------------------------------------------------------------------------- actions

# Every action's name: the protocol's `Request.action`, a finding's `action`, the CLI's verb. One
# line here and one in `actions.registry` (a unit test holds them equal).
ActionName = Literal["kill", "reclaim", "prune", "resume", "dump", "continue", "verify", "bench"]
ACTION_NAMES: tuple[ActionName, ...] = get_args(ActionName)
# A reply's stage: the plan, progress lines, then done.
ReplyStage = Literal["plan", "progress", "done"]
# How `reclaim` asks the kernel for the memory back, and whether it wrote directly or through sudo.
ReclaimMethod = Literal["cgroup2-memory.reclaim", "cgroup1-memory.force_empty", "drop_caches"]
ReclaimVia = Literal["direct", "sudo"]
# How `dump` read the trainer's stacks.
DumpMethod = Literal["faulthandler", "py-spy"]
# What `bench` says of the GPU against its floor, and where that floor came from.
BenchVerdict = Literal["ok", "slow"]
FloorSource = Literal["class", "trainroom.toml"]

# --------------------------------------------------------------------------- telling someone

# What an alert is: a finding or state's alert, its resolved follow-up, a test, a digest.
AlertKind = Literal["alert", "resolved", "test", "digest"]
# What became of one try to deliver it (`protocol.NotifyResult` says what each means).
NotifyOutcome = Literal["delivered", "retrying", "failed", "held", "dropped", "unavailable"]

# --------------------------------------------------------------------------- checkpoints

# A checkpoint's way through the keeper: seen, being verified, then verified or rejected; pruned
# once deleted to free space.
CkptState = Literal["candidate", "verifying", "verified", "held", "rejected", "pruned"]
CKPT_STATES: tuple[CkptState, ...] = get_args(CkptState)

# A checkpoint file's format, from its first bytes (`ckpt.formats.sniff_format`).
FileFormat = Literal["torch-zip", "torch-legacy", "pickle", "safetensors", "json", "empty", "unknown"]
# A directory that is one checkpoint: a Hugging Face `checkpoint-N/`, a torch.distributed.checkpoint
# directory. `ckpt.targets.DIR_FORMATS` says how each is recognised, `ckpt.dirs.VERIFIERS` how
# each is verified.
DirKind = Literal["hf-checkpoint", "dcp-checkpoint"]
# What a checkpoint is, as its report says: a file's format or a directory checkpoint's kind.
CkptFormat = Literal[FileFormat, DirKind]
# What a path stands for: one checkpoint (a file or a directory), a root holding checkpoints, or not one.
PathKind = Literal["file", DirKind, "root", "other"]

# A watched checkpoint file's way (`[checkpoints] watch`): settling until its writes stop, then
# verified (a copy taken) or rejected.
WatchedState = Literal["settling", "verifying", "verified", "rejected"]
# What a file of a checkpoint holds, as the verifier reads its values (`auto`: judged per tensor).
TensorRole = Literal["auto", "model", "optimizer", "metadata", "config", "not-loaded", "other"]
# A weight tensor whose spread is out of line: exploded (rejects) or unusual (says so).
OutlierKind = Literal["exploded", "unusual"]

FILE_FORMATS: tuple[FileFormat, ...] = get_args(FileFormat)
DIR_KINDS: tuple[DirKind, ...] = get_args(DirKind)
CKPT_FORMATS: tuple[CkptFormat, ...] = get_args(CkptFormat)

# --------------------------------------------------------------------------- findings

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
SEVERITY_RANK: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}

# How bad a figure, a state or a finding looks on screen (the control room's colours), from `dim`
# (ended, nothing wrong) to `crit`.
Level = Literal["dim", "ok", "info", "warn", "crit"]
LEVELS: tuple[Level, ...] = get_args(Level)

# The control room's figure panels a finding can colour.
Panel = Literal["trainer", "vram", "cadence", "lr", "loss", "ranks", "host", "disk"]
PANELS: tuple[Panel, ...] = get_args(Panel)

# Which part of the keeper raises a code: the trainer's life and its end, its progress, the
# numbers it reports (the sanity tracker), the GPU, the host, the disks, checkpoints, the keeper.
Family = Literal["life", "progress", "sanity", "gpu", "host", "disk", "checkpoint", "keeper"]

# finding-codes:begin (generated by scripts/findings_table.py from CATALOGUE below: add a code there)
FindingCode = Literal[
    "DEAD",
    "MASKED_ERROR",
    "REPEAT_DEATH",
    "RANK_RESTARTED",
    "HUNG",
    "STALLED",
    "SLOW",
    "LR_MISMATCH",
    "LR_RUNAWAY",
    "EXPLODED_START",
    "WHITE_MODEL",
    "LOSS_SPIKE",
    "DIVERGENCE",
    "GRAD_EXPLOSION",
    "NONFINITE",
    "RANK_OUTLIER",
    "LOSS_SCALE",
    "GHOST_MEMORY",
    "ORPHAN_CONTEXT",
    "GPU_LOST",
    "GPU_XID",
    "GPU_ECC",
    "GPU_THROTTLED",
    "GPU_LINK_DEGRADED",
    "HOST_RAM_LOW",
    "STALE_LOCK",
    "DUPLICATE_TRAINER",
    "DISK_HIGH",
    "DISK_FULL_SOON",
    "DRVFS_CHECKPOINTS",
    "STATE_DISK_LOW",
    "CKPT_REJECTED",
    "CKPT_INCOMPLETE",
    "CKPT_OUTSIDE_ROOT",
    "EVAL_REGRESSED",
    "JOURNAL_WRITE_FAILED",
    "RANK_CLAIMED",
    "FIELD_REFUSED",
    "RESUME_FROM_SCRATCH",
    "INTERNAL_ERROR",
]
# finding-codes:end
FINDING_CODES: tuple[FindingCode, ...] = get_args(FindingCode)


class FindingKind(NamedTuple):
    """What every reader knows of a code without reading its rule."""

    family: Family
    severity: Severity  # the worst it is raised at (some rules raise it milder as it recovers)
    means: str  # in one line, for the docs and help texts
    panel: Panel | None = None  # the figure panel it colours; None: the findings list only
    # Its figures move while the condition lasts (a growing gap, a ratio per sample): the keeper
    # keeps its first words and journals it again only when its cause, severity or fix changes.
    volatile: bool = False
    # The run state it comes with: one alert between the two (its key names an attempt or rank).
    alerted_as: AlertState | None = None


CATALOGUE: dict[FindingCode, FindingKind] = {
    "DEAD": FindingKind(
        "life", "critical", "the trainer died (a signal, a non-zero exit)", alerted_as="dead"
    ),
    "MASKED_ERROR": FindingKind(
        "life", "critical", "an error's words hide a different innermost cause (type, errno)"
    ),
    "REPEAT_DEATH": FindingKind("life", "warning", "two attempts in a row died around the same step"),
    "RANK_RESTARTED": FindingKind("life", "warning", "a rank died and its launcher restarted the group"),
    "HUNG": FindingKind(
        "progress",
        "critical",
        "the trainer is alive but stuck (stopped, in D state, or no progress)",
        volatile=True,
        alerted_as="hung",
    ),
    "STALLED": FindingKind(
        "progress", "warning", "no step within the stall bound", volatile=True, alerted_as="stalled"
    ),
    "SLOW": FindingKind(
        "progress", "warning", "steps slower than the median by the slow factor", volatile=True
    ),
    "LR_MISMATCH": FindingKind("sanity", "warning", "the learning rate differs from the one requested", "lr"),
    "LR_RUNAWAY": FindingKind(
        "sanity", "critical", "the learning rate climbed far above the one requested, mid-attempt", "lr"
    ),
    "EXPLODED_START": FindingKind("sanity", "warning", "the first loss is far above ln V", "loss"),
    "WHITE_MODEL": FindingKind(
        "sanity", "warning", "the loss sits at ln V: the model learns nothing", "loss"
    ),
    "LOSS_SPIKE": FindingKind("sanity", "warning", "the loss jumped well above its recent level", "loss"),
    "DIVERGENCE": FindingKind("sanity", "warning", "the loss climbs steadily", "loss"),
    "GRAD_EXPLOSION": FindingKind("sanity", "warning", "the gradient norm jumped", "loss"),
    "NONFINITE": FindingKind("sanity", "critical", "a NaN or Inf in the loss, gradients or weights", "loss"),
    "RANK_OUTLIER": FindingKind(
        "sanity", "warning", "one rank's loss or pace is out of line with the others", "loss"
    ),
    "LOSS_SCALE": FindingKind(
        "sanity", "warning", "the fp16 loss scale halved, or collapsed below its floor"
    ),
    "GHOST_MEMORY": FindingKind(
        "gpu", "warning", "VRAM held that no live process owns", "vram", volatile=True
    ),
    "ORPHAN_CONTEXT": FindingKind(
        "gpu", "critical", "a process of an earlier attempt still holds the GPU", "vram", volatile=True
    ),
    "GPU_LOST": FindingKind(
        "gpu", "critical", "the run's GPU fell off the bus (Xid 79) or NVML says it is lost: drain the node"
    ),
    "GPU_XID": FindingKind(
        "gpu", "critical", "the driver reported an Xid on the run's GPU (kernel log or NVML), with what to do"
    ),
    "GPU_ECC": FindingKind(
        "gpu", "critical", "uncorrectable ECC errors, or a page retirement or row remap waiting for a reset"
    ),
    "GPU_THROTTLED": FindingKind(
        "gpu",
        "warning",
        "the run's GPU clocks are held down (thermal, hardware slowdown, a lowered power cap)",
        volatile=True,
    ),
    "GPU_LINK_DEGRADED": FindingKind(
        "gpu", "warning", "the GPU's PCIe link trained below its max width, or its generation under load"
    ),
    "HOST_RAM_LOW": FindingKind("host", "critical", "the host runs out of memory", "host", volatile=True),
    "STALE_LOCK": FindingKind("host", "critical", "a lock file held by a process that is gone"),
    "DUPLICATE_TRAINER": FindingKind("host", "warning", "another trainer of the same run is running"),
    "DISK_HIGH": FindingKind("disk", "critical", "the checkpoint disk is nearly full", "disk"),
    "DISK_FULL_SOON": FindingKind("disk", "critical", "at this rate the checkpoint disk fills soon", "disk"),
    "DRVFS_CHECKPOINTS": FindingKind("disk", "warning", "checkpoints on a slow Windows drive (WSL)", "disk"),
    "STATE_DISK_LOW": FindingKind("disk", "critical", "the disk holding the journal is nearly full"),
    "CKPT_REJECTED": FindingKind("checkpoint", "critical", "a checkpoint failed verification", "disk"),
    "CKPT_INCOMPLETE": FindingKind(
        "checkpoint",
        "warning",
        "a checkpoint lacks part of a faithful resume (optimizer, scheduler...) the run's others hold",
        "disk",
    ),
    "CKPT_OUTSIDE_ROOT": FindingKind(
        "checkpoint", "warning", "an announced checkpoint outside the run's checkpoint root"
    ),
    "EVAL_REGRESSED": FindingKind(
        "checkpoint",
        "warning",
        "the trainer's own evaluation held a verified checkpoint back: it regressed or gave no figure",
        "disk",
    ),
    "JOURNAL_WRITE_FAILED": FindingKind("keeper", "critical", "the keeper cannot write the journal"),
    "RANK_CLAIMED": FindingKind("keeper", "warning", "two reporters claim the same rank"),
    "FIELD_REFUSED": FindingKind(
        "keeper", "warning", "a trainer sent a value out of range: that field refused, the rest kept"
    ),
    "RESUME_FROM_SCRATCH": FindingKind(
        "keeper", "critical", "a resumed attempt started far below the checkpoint it resumed"
    ),
    "INTERNAL_ERROR": FindingKind("keeper", "critical", "a rule or probe of the keeper raised"),
}

# The groups, read off the catalogue.
VOLATILE: frozenset[FindingCode] = frozenset(c for c, k in CATALOGUE.items() if k.volatile)
ALERTED_AS_STATE: frozenset[FindingCode] = frozenset(c for c, k in CATALOGUE.items() if k.alerted_as)
SANITY_CODES: tuple[FindingCode, ...] = tuple(c for c, k in CATALOGUE.items() if k.family == "sanity")
PANEL_CODES: dict[Panel, tuple[FindingCode, ...]] = {
    panel: tuple(c for c, k in CATALOGUE.items() if k.panel == panel) for panel in PANELS
}

# --------------------------------------------------------------------------- cause and consequence


class Follows(NamedTuple):
    """A finding this code may be a consequence of: while `cause` is open, a finding of the code
    is shown folded under it (`run.causes.fold`), and the header names the cause."""

    cause: FindingCode
    # The consequence's evidence field that shows it comes from this cause (a rejected
    # checkpoint's `nonfinite` tensors); None: any finding of the code, while the cause is open.
    shown_by: str | None = None
    # Only a finding first seen after the cause's first sighting follows it (the numbers: a
    # divergence seen before the gradients jumped is not their doing). False: a standing
    # condition that may be seen late (a lock a dead process holds, a full disk).
    after: bool = False


# What each code may follow from, the likeliest cause first. A link says what happens in a run
# (a NaN model saves checkpoints the verifier rejects), not what merely tends to come together.
FOLLOWS: dict[FindingCode, tuple[Follows, ...]] = {
    # A host out of memory fails an allocation behind an error that hides ENOMEM. (A death is
    # not folded: DEAD is the run's state, and its own row keeps the resume it offers.)
    "MASKED_ERROR": (Follows("HOST_RAM_LOW"),),
    # A GPU that fell off the bus or raised an Xid kills or wedges the trainer on it: the death
    # or the hang is its consequence (a standing condition: the kernel's line may be read a
    # moment after the keeper reaped the trainer). DEAD's own resume is then refused onto that
    # device (actions/resume.py).
    "DEAD": (Follows("GPU_LOST"), Follows("GPU_XID")),
    # The progress verdicts: a trainer waiting on a lock a dead process holds stalls, then hangs;
    # one that hangs has stopped stepping; two trainers on one GPU slow each other; a host that
    # swaps slows the steps.
    "HUNG": (Follows("STALE_LOCK"), Follows("GPU_LOST"), Follows("GPU_XID")),
    "STALLED": (Follows("STALE_LOCK"), Follows("HUNG"), Follows("GPU_LOST"), Follows("GPU_XID")),
    "SLOW": (
        Follows("GPU_THROTTLED", after=True),
        Follows("HUNG"),
        Follows("STALLED"),
        Follows("DUPLICATE_TRAINER"),
        Follows("HOST_RAM_LOW"),
    ),
    # The numbers: an LR far from the one asked for (a schedule restarted from scratch, or one
    # that climbs away mid-attempt: LR_RUNAWAY) drives
    # the loss up, the gradients with it, and on to NaN, or (far too low) leaves the model
    # learning nothing; an fp16 scaler halves on overflow.
    "LR_MISMATCH": (Follows("RESUME_FROM_SCRATCH"),),
    "GRAD_EXPLOSION": (
        Follows("LR_RUNAWAY", after=True),
        Follows("LR_MISMATCH", after=True),
        Follows("LOSS_SPIKE", after=True),  # a loss far above its level: gradients far above theirs
    ),
    "WHITE_MODEL": (Follows("LR_MISMATCH", after=True),),
    "LOSS_SPIKE": (
        Follows("EXPLODED_START", after=True),
        Follows("LR_RUNAWAY", after=True),
        Follows("LR_MISMATCH", after=True),
        Follows("GRAD_EXPLOSION", after=True),
    ),
    "DIVERGENCE": (
        Follows("LR_RUNAWAY", after=True),
        Follows("LR_MISMATCH", after=True),
        Follows("GRAD_EXPLOSION", after=True),
        Follows("LOSS_SPIKE", after=True),
    ),
    "NONFINITE": (
        Follows("LR_RUNAWAY", after=True),
        Follows("LR_MISMATCH", after=True),
        Follows("GRAD_EXPLOSION", after=True),
        Follows("DIVERGENCE", after=True),
    ),
    "LOSS_SCALE": (Follows("NONFINITE", after=True), Follows("GRAD_EXPLOSION", after=True)),
    # The GPU: memory of the run its allocator cannot see, while a context of an earlier attempt
    # outlives its process, is that context's. An Xid follows a lost GPU's fall, and an ECC
    # error's Xid (48, 63, 94, 95) the ECC finding.
    "GHOST_MEMORY": (Follows("ORPHAN_CONTEXT"),),
    "GPU_XID": (Follows("GPU_LOST"), Follows("GPU_ECC")),
    # A second trainer of the run claims the ranks the first holds.
    "RANK_CLAIMED": (Follows("DUPLICATE_TRAINER"),),
    # The disks: a full disk or a Windows drive under WSL lands a save short; a full state disk
    # fails the journal's writes; a disk above its mark is the one the forecast fills.
    "DISK_FULL_SOON": (Follows("DISK_HIGH"),),
    "JOURNAL_WRITE_FAILED": (Follows("STATE_DISK_LOW"),),
    # A checkpoint of a model gone to NaN holds NaN; one of a diverged model is out of line with
    # the last verified one.
    "CKPT_REJECTED": (
        Follows("NONFINITE", shown_by="nonfinite", after=True),
        Follows("LR_RUNAWAY", shown_by="outliers", after=True),
        Follows("DIVERGENCE", shown_by="outliers", after=True),
        Follows("GRAD_EXPLOSION", shown_by="outliers", after=True),
        Follows("LOSS_SPIKE", shown_by="outliers", after=True),
        Follows("EXPLODED_START", shown_by="outliers", after=True),
        Follows("DISK_HIGH"),
        Follows("DRVFS_CHECKPOINTS"),
    ),
    # A model that diverged or went non-finite evaluates worse: its held checkpoints follow.
    "EVAL_REGRESSED": (
        Follows("LR_RUNAWAY", after=True),
        Follows("NONFINITE", after=True),
        Follows("DIVERGENCE", after=True),
        Follows("GRAD_EXPLOSION", after=True),
        Follows("LOSS_SPIKE", after=True),
    ),
}

# What must be fixed before another row's fix can work: while both are open, the row of the code
# on the left is shown (and its key offered) above the rows of the codes on the right, whatever
# their severity and age. A resume (DEAD's fix) loads the checkpoint into host RAM and claims the
# GPU and the lock again: the RAM an ENOMEM death hid, the memory a context left behind holds and
# a lock a dead process holds are in its way.
STANDS_IN_THE_WAY: dict[FindingCode, tuple[FindingCode, ...]] = {
    "MASKED_ERROR": ("DEAD", "REPEAT_DEATH"),
    "HOST_RAM_LOW": ("DEAD", "REPEAT_DEATH"),
    "ORPHAN_CONTEXT": ("DEAD", "REPEAT_DEATH"),
    "STALE_LOCK": ("DEAD", "REPEAT_DEATH"),
}

# How many findings of one code are said in words, (one, many): "14 checkpoints rejected".
# A code not here is counted as "3 × CODE".
COUNTED: dict[FindingCode, tuple[str, str]] = {
    "CKPT_REJECTED": ("checkpoint rejected", "checkpoints rejected"),
    "CKPT_OUTSIDE_ROOT": ("checkpoint outside the root", "checkpoints outside the root"),
    "EVAL_REGRESSED": ("checkpoint held back by its evaluation", "checkpoints held back by their evaluation"),
    "ORPHAN_CONTEXT": ("GPU context left behind", "GPU contexts left behind"),
    "STALE_LOCK": ("stale lock", "stale locks"),
    "DUPLICATE_TRAINER": ("other trainer", "other trainers"),
    "RANK_OUTLIER": ("rank out of line", "ranks out of line"),
    "RANK_CLAIMED": ("rank claimed twice", "ranks claimed twice"),
    "FIELD_REFUSED": ("field refused", "fields refused"),
    "MASKED_ERROR": ("masked error", "masked errors"),
    "INTERNAL_ERROR": ("rule failed", "rules failed"),
    "DEAD": ("death", "deaths"),
    "GPU_XID": ("Xid", "Xids"),
}
