"""The wire protocol: msgspec Structs, one tagged union per direction, length-prefixed msgpack
frames on a Unix stream socket.

A frame is a 4-byte big-endian length followed by that many bytes of msgpack. A frame longer than
the direction's limit, or a body that does not decode into the direction's union, is a
`ProtocolError`: the keeper closes that one connection, journals why, and the run goes on.

The same records are what the keeper journals and what it sends clients as live deltas, so a
client folds exactly what a replay of the journal folds (see `state.RunState.apply`).
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

from trainroom.core import resumable
from trainroom.core.configuration.config import Thresholds
from trainroom.core.findings import Finding
from trainroom.core.samples import DiskSample, GpuSample, HostSample, ProcsSample, VitalsSample, VramFloor
from trainroom.core.vocab import (
    ActionName,
    AlertKind,
    CkptFormat,
    CkptState,
    FindingCode,
    NotifyOutcome,
    PhaseName,
    RateSource,
    ReplyStage,
    Severity,
    StateName,
    StepSource,
    WorkerEndSource,
)
from trainroom.core.wire.errorchain import ErrorLink as ErrorLink
from trainroom.core.wire.errorchain import error_chain as error_chain
from trainroom.core.wire.errorchain import unwrap_workers as unwrap_workers
from trainroom.core.wire.framing import HEADER as HEADER
from trainroom.core.wire.framing import MAX_INBOUND_FRAME as MAX_INBOUND_FRAME
from trainroom.core.wire.framing import MAX_OUTBOUND_FRAME as MAX_OUTBOUND_FRAME
from trainroom.core.wire.framing import FrameReader as FrameReader
from trainroom.core.wire.framing import ProtocolError as ProtocolError
from trainroom.core.wire.framing import encode as encode
from trainroom.core.wire.framing import frame as frame

PROTOCOL_VERSION = 1

# Every number a trainer sends is checked where it arrives: steps and counts are never negative,
# times and bounds are finite. A field that breaks its bound is refused alone (`salvage`): the rest
# of its frame and the connection are kept, and FIELD_REFUSED names it. A loss or a grad norm may
# be NaN or Inf: that is a measurement (NONFINITE), not a bad field.
Count = Annotated[int, msgspec.Meta(ge=0)]
Pid = Annotated[int, msgspec.Meta(ge=1)]
Time = Annotated[float, msgspec.Meta(ge=0, le=1e11)]  # seconds since the epoch
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]
# A requested LR of 0 is a frozen model (or group): legitimate, and nothing to compare against.
Rate = Annotated[float, msgspec.Meta(ge=0, le=1e6)]
# Strings are bounded so no trainer can make the keeper hold (or a snapshot carry) megabytes.
Name = Annotated[str, msgspec.Meta(max_length=256)]
Path_ = Annotated[str, msgspec.Meta(max_length=4096)]
Text = Annotated[str, msgspec.Meta(max_length=16384)]
LongText = Annotated[str, msgspec.Meta(max_length=262144)]


# --------------------------------------------------------------------------- trainer -> keeper


class RequestedConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the session asked for; what LR_MISMATCH and the ln(V) baselines compare against."""

    lr: Rate | None = None
    vocab_size: Annotated[int, msgspec.Meta(ge=1)] | None = None
    warmup_steps: Count | None = None
    arch: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] = {}


class Hello(msgspec.Struct, tag="hello", kw_only=True, omit_defaults=True):
    v: int = PROTOCOL_VERSION
    pid: Pid
    rank: Count = 0
    world_size: Annotated[int, msgspec.Meta(ge=1)] = 1
    config: RequestedConfig = msgspec.field(default_factory=RequestedConfig)
    argv: Annotated[list[Text], msgspec.Meta(max_length=1024)] = []


class BatchRef(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """A batch's stable identity: what the trainer's data pipeline needs to hand out the same
    batch again (`trainroom replay`). Any of: the epoch and the batch's index in it, the
    sampler's seed, the ids of its samples, or a tag of the trainer's own."""

    epoch: Count | None = None
    index: Count | None = None
    seed: int | None = None
    ids: Annotated[list[int], msgspec.Meta(max_length=256)] = []
    tag: Name | None = None


class Step(msgspec.Struct, tag="step", kw_only=True, omit_defaults=True):
    step: Count
    t: Time
    tokens: Count | None = None
    loss: float | None = None
    grad_norm: float | None = None
    lr: Annotated[list[float], msgspec.Meta(max_length=1024)] = []  # effective LR per param group
    loss_scale: float | None = None
    alloc_allocated: Count | None = None
    alloc_reserved: Count | None = None
    alloc_peak: Count | None = None
    source: StepSource = "reporter"
    # A log step's pace by the trainer's own timing where its line says it (core/logs/logtiming):
    # steps a second, and what it was read from.
    rate: Annotated[float, msgspec.Meta(gt=0, lt=1e7)] | None = None
    rate_from: RateSource | None = None
    # The batch this step trained on (the keeper keeps a window of them in memory, and journals
    # the window when a loss spike, a divergence or a non-finite value opens: see BatchLog).
    batch: BatchRef | None = None


class Heartbeat(msgspec.Struct, tag="heartbeat", kw_only=True, omit_defaults=True):
    t: Time
    phase: Name = "train"
    # Where the main thread is ("file:line in func") and for how long it has been there: a main
    # thread parked on one line while this thread still beats is a hang, not a stall.
    main_frame: Text | None = None
    main_frame_age_s: Seconds | None = None
    dropped: Count = 0


class Phase(msgspec.Struct, tag="phase", kw_only=True, omit_defaults=True):
    name: PhaseName
    t: Time
    bound_s: Seconds | None = None  # how long this phase may take before it is a stall


class Checkpoint(msgspec.Struct, tag="checkpoint", kw_only=True, omit_defaults=True):
    path: Path_
    step: Count
    t: Time
    size_bytes: Count | None = None
    digest: Name | None = None


class Crash(msgspec.Struct, tag="crash", kw_only=True, omit_defaults=True):
    t: Time
    chain: Annotated[list[ErrorLink], msgspec.Meta(max_length=64)]  # outermost first; the innermost last
    traceback: LongText = ""
    source: StepSource = "reporter"


class Note(msgspec.Struct, tag="note", kw_only=True, omit_defaults=True):
    """An info event from the trainer: an LR re-imposed, a loss-scale halving, a first
    non-finite module. `kind` names it; `data` carries the figures."""

    kind: Name
    t: Time
    message: Text = ""
    step: Count | None = None
    data: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] = {}


class Bye(msgspec.Struct, tag="bye", kw_only=True, omit_defaults=True):
    t: Time
    reason: Text = "finished"


# --------------------------------------------------------------------------- client -> keeper


class Subscribe(msgspec.Struct, tag="subscribe", kw_only=True, omit_defaults=True):
    v: int = PROTOCOL_VERSION
    client: Name = "client"
    live: bool = True  # False: snapshot only, then the keeper closes (what `status` uses)


class Request(msgspec.Struct, tag="request", kw_only=True, omit_defaults=True):
    """An action request. `confirm=False` asks for the plan (the exact target) only."""

    id: int
    # A word a client sends: `vocab.ActionName`, `cancel`, `notify-test`, or one this keeper does
    # not know (a newer client's), which it answers in words rather than failing to decode.
    action: Name
    args: Annotated[dict[str, Any], msgspec.Meta(max_length=64)] = {}
    confirm: bool = False


# A confirmed request's `args` carry the plan the client showed under this key (the keeper plans
# again and refuses a target that changed since): `confirming` writes it, `Action.serve` reads it.
EXPECT = "expect"


def confirming(args: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """`args` of a confirmed request: the arguments, and the plan (`Reply.plan`) confirmed."""
    return {**args, EXPECT: dict(plan)}


TrainerMsg = Union[Hello, Step, Heartbeat, Phase, Checkpoint, Crash, Note, Bye]
ClientMsg = Union[Subscribe, Request]
InboundMsg = Union[Hello, Step, Heartbeat, Phase, Checkpoint, Crash, Note, Bye, Subscribe, Request]


# ------------------------------------------------------- keeper records (journal and live deltas)


class AttemptStarted(msgspec.Struct, tag="attempt-started", kw_only=True, omit_defaults=True):
    n: int
    t: float
    pid: int
    pgid: int
    start_time: float  # the process's create time: with pid, what tells it from a reused pid
    # /proc/<pid>/stat field 22, clock ticks since boot: exact, where start_time (psutil's boot time +
    # ticks) moves with the wall clock and is compared within a second. None: written before it existed.
    start_ticks: int | None = None
    argv: list[str]
    cwd: str
    resume_from: str | None = None
    resume_step: int | None = None  # the step of the checkpoint it resumes from, when known
    requested: RequestedConfig = msgspec.field(default_factory=RequestedConfig)  # from argv
    # The devices' memory just before the trainer started (None: no driver view): what a kill
    # judges the release against where the driver gives no per-process memory.
    vram_floor: VramFloor | None = None
    # A process trainroom did not start, adopted by `trainroom attach`: the keeper is not its
    # parent, so its exit status is never known (its death is, through a pidfd).
    attached: bool = False


class AttemptEnded(msgspec.Struct, tag="attempt-ended", kw_only=True, omit_defaults=True):
    n: int
    t: float
    exit_code: int | None = None
    exit_signal: int | None = None
    error: str | None = None  # the command could not be started at all


class AttemptStopping(msgspec.Struct, tag="attempt-stopping", kw_only=True, omit_defaults=True):
    """A user's kill is about to signal the attempt (journaled before the first signal): an end
    by `until` is "stopped", not a death, and no automatic resume follows it. An end after
    `until` (the kill failed, and something else ended it later) is judged as usual."""

    n: int
    t: float
    by: str  # who asked: the client ("tui pid 123", "cli pid 456")
    until: float  # the kill's deadline: grace + the confirmation's time, with a margin
    action: ActionName = "kill"


class WorkerSeen(msgspec.Struct, tag="worker-seen", kw_only=True, omit_defaults=True):
    """A rank's process of an attempt, first seen under its leader in the process tree (a
    torchrun worker: its own session; rank from the environment it started with)."""

    attempt: int
    t: float
    pid: int
    rank: int
    start_ticks: int  # with the pid, the process's identity (kill proves it before signalling)
    local_rank: int | None = None
    world_size: int | None = None
    pgid: int = 0
    sid: int = 0
    restarts_left: int | None = None  # torch elastic's: 0 means a failed worker ends the attempt


class WorkerEnded(msgspec.Struct, tag="worker-ended", kw_only=True, omit_defaults=True):
    """A rank's process ended. How, by `source`: its zombie's wait status, read before its parent
    reaped it ("wait-status"); torchrun's own report of it ("launcher"); or not known ("gone").
    A later record for the same pid may add what an earlier one could not say."""

    attempt: int
    t: float
    pid: int
    rank: int
    exit_code: int | None = None
    exit_signal: int | None = None
    source: WorkerEndSource = "gone"
    root_cause: bool = False  # torchrun named it the first observed failure


class Received(msgspec.Struct, tag="rx", kw_only=True, omit_defaults=True):
    """A trainer message as the keeper took it in, stamped with attempt, rank and arrival time."""

    attempt: int
    rank: int
    t: float
    msg: TrainerMsg


class FindingRaised(msgspec.Struct, tag="finding", kw_only=True, omit_defaults=True):
    finding: Finding


class FindingCleared(msgspec.Struct, tag="finding-cleared", kw_only=True, omit_defaults=True):
    ident: str
    t: float


class CheckpointReport(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What the journal keeps of a checkpoint's verification: the verdict in brief and, once
    promoted, where it went. The whole report (per-tensor figures) is in the step directory's
    manifest, or beside a rejected candidate as `.verify.json`."""

    ok: bool = False
    reason: str | None = None
    problems: list[str] = []
    format: CkptFormat | None = None
    tensors: int = 0
    params: int = 0
    digest_ok: bool | None = None
    deferred: bool = False
    seconds: float = 0.0
    refused_types: list[str] = []
    error_chain: list[ErrorLink] = []
    notes: list[str] = []  # found and reported, not a rejection (non-finite metadata, files not loaded)
    promoted_dir: str | None = None  # the step directory it was promoted to
    promoted_file: str | None = None  # the checkpoint file in it (what a resume loads)
    source: str | None = None  # the watched file a verified copy was taken from
    completeness: resumable.Completeness | None = None  # what it holds of a faithful resume (None: not read)


class EvalFigure(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """The trainer's own evaluation of a verified candidate, run before it was promoted."""

    figure: float | None = None  # None: non-finite, or none found in its output
    passed: bool = False
    why: str = ""  # the judgement in words
    best: float | None = None  # the best promoted figure it was judged against
    seconds: float = 0.0
    exit_code: int | None = None
    # What was run and read: `trainroom eval` reproduces with these, not with a re-read [eval].
    command: str | None = None
    pattern: str | None = None
    figure_name: str | None = None  # what the figure was printed as (`eval_loss`), or `pattern`
    leftovers: int = 0  # processes it left behind, killed when it ended


class CheckpointState(msgspec.Struct, tag="ckpt", kw_only=True, omit_defaults=True):
    """A checkpoint changed state: candidate, verifying, verified, held (by its evaluation),
    rejected, pruned."""

    path: str
    step: int | None
    state: CkptState
    t: float
    reason: str | None = None
    size_bytes: int | None = None
    digest: str | None = None
    report: CheckpointReport | None = None
    eval: EvalFigure | None = None


class ActionRecord(msgspec.Struct, tag="action", kw_only=True, omit_defaults=True):
    """An action that was carried out (or refused), with its evidence: journaled."""

    action: str  # the request's word, as it came (see Request.action)
    t: float
    ok: bool
    message: str
    target: dict[str, Any] = {}
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    client: str = ""


class TrainerDisconnected(msgspec.Struct, tag="trainer-gone", kw_only=True, omit_defaults=True):
    """A rank's reporter connection closed (its process's exit says why, if it exited)."""

    attempt: int
    rank: int
    t: float


class ConnectionClosed(msgspec.Struct, tag="conn-closed", kw_only=True, omit_defaults=True):
    t: float
    peer_pid: int | None
    reason: str


class ProbeSample(msgspec.Struct, tag="probe", kw_only=True, omit_defaults=True):
    """The latest driver, host and disk readings. Sent live, kept in the snapshot, not journaled."""

    t: float
    gpu: GpuSample | None = None
    host: HostSample | None = None
    disk: DiskSample | None = None
    procs: ProcsSample | None = None
    # A probe that raised (a bug, not an unavailable reading): its name -> "Type: message\n<traceback>".
    faults: dict[str, str] = {}


class Vitals(msgspec.Struct, tag="vitals", kw_only=True):
    """The history graphs' figures from one probe cycle, journaled every few seconds (run.vitals)."""

    v: VitalsSample


class RunStatus(msgspec.Struct, tag="status", kw_only=True, omit_defaults=True):
    """The watchdog's verdict changed (`vocab.StateName`), or the launch failed."""

    t: float
    state: StateName
    reason: str = ""


class KeeperStarted(msgspec.Struct, tag="keeper-started", kw_only=True, omit_defaults=True):
    """A keeper took the run, with the thresholds its rules judge by: every reader (the control
    room, `status` of a finished run) computes the same bounds from the same numbers."""

    t: float
    pid: int
    start_ticks: int | None = None
    thresholds: Thresholds = msgspec.field(default_factory=Thresholds)
    # The resume template the keeper will use and where it came from (RunSettings).
    resume_template: str | None = None
    resume_template_from: str | None = None


class LogRecognised(msgspec.Struct, tag="log-recognised", kw_only=True, omit_defaults=True):
    """Which log recogniser (core/logs/logformats) read an uninstrumented attempt's steps: `hf`,
    `lightning`, `nanogpt`, `tqdm`, `lines`, or `pattern` (the run's own), and what its steps
    count (`unit`: optimizer steps, batches, logged dicts...). Name `none`: nothing was recognised
    in the attempt's first `lines` lines."""

    t: float
    attempt: int
    name: Name
    unit: Name = ""
    lines: int = 0


class JournalDamaged(msgspec.Struct, tag="journal-damaged", kw_only=True, omit_defaults=True):
    """Not written by anyone: what a journal reader found unreadable at `offset` (the records
    before and after it are kept). Folded like any record so every reader reports it."""

    offset: int
    skipped_bytes: int
    torn_tail: bool = False  # the damage runs to the end of the file (a write cut short)
    unknown_records: int = 0  # whole records of a newer version this reader cannot decode


class KeeperNote(msgspec.Struct, tag="keeper-note", kw_only=True, omit_defaults=True):
    t: float
    message: str
    kind: str = "info"


class NotifyResult(msgspec.Struct, tag="notify", kw_only=True, omit_defaults=True):
    """One try to tell someone (core/notify): an alert, its resolved follow-up or a test, through
    one channel. `channel` is redacted (`webhook https://hooks.slack.com/…#1a2b`): a target's
    secret never reaches the journal. Outcomes: delivered; retrying (this try failed, another
    follows); failed (the last try failed); held (over the rate limit: it goes out in the next
    digest); dropped (the channel's queue was full); unavailable (the channel cannot work here)."""

    t: float
    channel: str
    outcome: NotifyOutcome
    kind: AlertKind = "alert"
    alert: str = ""  # the alert's identity: a finding's ident, or a state's name in capitals
    severity: Severity | None = None  # None: no alert was made (a channel unavailable)
    try_n: int = 0  # 1-based; 0: no try was made (held, dropped, unavailable)
    detail: str = ""  # HTTP 500, timed out after 5 s, exit 3, ... (redacted too)
    latency_s: float | None = None  # from the alert to this outcome


class StepBatch(msgspec.Struct, tag="steps", kw_only=True, omit_defaults=True):
    """Consecutive step and heartbeat records of one attempt, in the order they arrived, kept as
    compressed columns (`run.stepbatch`): what the keeper journals in their place. A journal
    reader expands it back into exactly those `Received` records, so no fold ever sees it."""

    attempt: int
    rows: int  # step records
    beats: int = 0  # heartbeat records
    codec: int = 1
    data: bytes


class JournalBase(msgspec.Struct, tag="base", kw_only=True, omit_defaults=True):
    """The first record of every journal segment after the first: the fold of all the records
    before it (`run.snapshot`'s encoding of the run's view), so a reader starts here and never
    needs the sealed segments behind it. A fold that meets one mid-replay ignores it."""

    seq: int  # 1 for the second segment, 2 for the third, ...
    segment: str  # this segment's id (what a snapshot names)
    previous: str = ""  # the id of the segment it follows ("" for the first, which has no base)
    t: float
    records: int = 0  # records folded into `view`
    view: bytes


class BatchRow(msgspec.Struct, array_like=True, frozen=True):
    step: int
    loss: float | None
    batch: BatchRef


class BatchLog(msgspec.Struct, tag="batches", kw_only=True, omit_defaults=True):
    """The batches of the steps around a finding that may be the data's doing (LOSS_SPIKE,
    DIVERGENCE, NONFINITE), journaled once when it opens: what `trainroom replay` replays."""

    t: float
    code: FindingCode
    ident: str
    attempt: int
    rank: int = 0
    rows: list[BatchRow] = []


Record = Union[
    AttemptStarted,
    AttemptEnded,
    AttemptStopping,
    Received,
    FindingRaised,
    FindingCleared,
    CheckpointState,
    ActionRecord,
    ConnectionClosed,
    TrainerDisconnected,
    ProbeSample,
    Vitals,
    RunStatus,
    KeeperStarted,
    KeeperNote,
    JournalDamaged,
    NotifyResult,
    WorkerSeen,
    WorkerEnded,
    LogRecognised,
    StepBatch,
    JournalBase,
    BatchLog,
]

# --------------------------------------------------------------------------- keeper -> client


class Snapshot(msgspec.Struct, tag="snapshot", kw_only=True):
    v: int
    state: Any  # run.state.RunState, as builtins (decoded into RunState by the client)
    # run.series.SeriesSnapshot, as builtins: the plot series is a fold of the same records,
    # kept beside the state (the client keeps folding live records into both).
    series: Any = None
    vitals: Any = None  # run.vitals.VitalsHistory's samples, as builtins: the history graphs


class Delta(msgspec.Struct, tag="delta", kw_only=True):
    records: list[Record]


class Reply(msgspec.Struct, tag="reply", kw_only=True, omit_defaults=True):
    """The answer to a Request: a plan, progress lines, then done (ok or not) with evidence."""

    id: int
    action: str  # the request's word, as it came (see Request.action)
    stage: ReplyStage
    ok: bool = True
    message: str = ""
    plan: dict[str, Any] = {}
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}


KeeperMsg = Union[Snapshot, Delta, Reply]

NOTE_DATA_BYTES = 16384


def bounded(msg: TrainerMsg) -> TrainerMsg:
    """What the keeper keeps of a trainer message: a note's free-form data is cut to a summary
    when it would take more than NOTE_DATA_BYTES (the strings are bounded by their types)."""
    if isinstance(msg, Note) and msg.data:
        size = len(_encoder.encode(msg.data))
        if size > NOTE_DATA_BYTES:
            return msgspec.structs.replace(msg, data={"truncated_bytes": size})
    return msg


# --------------------------------------------------------------------------- framing

_encoder = msgspec.msgpack.Encoder()
inbound_decoder: msgspec.msgpack.Decoder[InboundMsg] = msgspec.msgpack.Decoder(InboundMsg)
keeper_decoder: msgspec.msgpack.Decoder[KeeperMsg] = msgspec.msgpack.Decoder(KeeperMsg)
record_decoder: msgspec.msgpack.Decoder[Record] = msgspec.msgpack.Decoder(Record)
