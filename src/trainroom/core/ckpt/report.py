"""What a verification finds, and what a checkpoint is checked against, as records.

`VerifyReport` is what `verify()` returns, what the warm verifier sends back over its pipe
(msgspec JSON, one a line), what `trainroom verify --json` prints and what the keeper's verify
action answers; `journal_report` is the small part of it the journal keeps. `Expected` is what a
file must match: its save-time record, the declared config, the previous verified checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from trainroom.core.ckpt.digest import DIGEST_ALGO
from trainroom.core.resumable import Completeness
from trainroom.core.vocab import CkptFormat, OutlierKind, TensorRole
from trainroom.core.wire import protocol as p

# What a checkpoint is: a file's format from its first bytes (formats.sniff_format), or a
# directory checkpoint (a Hugging Face `checkpoint-N/`, a torch.distributed.checkpoint directory).
Format = CkptFormat
# What a file inside a checkpoint holds, which decides what a non-finite value in it means:
# weights and optimizer state reject; metadata (callbacks, schedulers, RNG, loggers) is reported.


class NonFinite(msgspec.Struct, kw_only=True, frozen=True):
    nan: int = 0
    inf: int = 0


class Outlier(msgspec.Struct, kw_only=True, frozen=True):
    """A weight tensor whose spread is out of line: exploded (rejects) or unusual (says so)."""

    name: str
    std: float
    median_std: float | None = None
    previous_std: float | None = None
    kind: OutlierKind
    why: str


class Arch(msgspec.Struct, kw_only=True, frozen=True):
    """The architecture fingerprint read off the tensors (None where it cannot be told)."""

    layers: int | None = None
    d_model: int | None = None
    vocab: int | None = None
    params: int | None = None
    embedding: str | None = None  # the tensor vocab and d_model were read from
    lm_head: str | None = None


class ArchMismatch(msgspec.Struct, kw_only=True, frozen=True):
    field: str
    expected: int
    found: int
    against: str  # declared | in-file config | previous


class RamNeed(msgspec.Struct, kw_only=True, frozen=True):
    """Host RAM at verification time, and what a verification and a resume's full load need."""

    mem_available: int | None
    need_to_resume: int
    need_to_verify: int


class Previous(msgspec.Struct, kw_only=True, frozen=True):
    """The previous verified checkpoint, as a new one is compared with it."""

    path: str = ""
    arch: Arch = msgspec.field(default_factory=Arch)
    stds: dict[str, float] = {}


class Expected(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """What a checkpoint file must match. Any field may be unknown."""

    digest: str | None = None
    size_bytes: int | None = None
    step: int | None = None
    # The declared model config, in any spelling `inventory.ARCH_ALIASES` knows (n_layer, ...).
    arch: dict[str, object] = {}
    previous: Previous | None = None

    def merged(self, over: Expected | None) -> Expected:
        """These expectations with what `over` knows put over them."""
        if over is None:
            return self
        return Expected(
            digest=over.digest if over.digest is not None else self.digest,
            size_bytes=over.size_bytes if over.size_bytes is not None else self.size_bytes,
            step=over.step if over.step is not None else self.step,
            arch=over.arch or self.arch,
            previous=over.previous if over.previous is not None else self.previous,
        )


class FileVerdict(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True):
    """One file of a directory checkpoint: how it was read and what it said."""

    name: str
    role: TensorRole = "other"
    format: Format | None = None
    size_bytes: int = 0
    digest: str | None = None
    tensors: int = 0
    ok: bool = True
    reason: str | None = None


class VerifyReport(msgspec.Struct, kw_only=True, frozen=True):
    """One checkpoint file's verification. `ok` with no `reason` when it passed; otherwise `reason`
    is the first of `problems`. `deferred`: no verdict yet (host RAM short, the verifier timed out
    or died): try again, it says nothing against the file."""

    ok: bool = False
    reason: str | None = None
    problems: list[str] = []
    path: str = ""
    format: Format | None = None
    size_bytes: int | None = None
    digest: str | None = None
    digest_algo: str = DIGEST_ALGO
    expected_digest: str | None = None
    digest_ok: bool | None = None
    step: int | None = None
    model_key: str | None = None  # where the weights sit in the file ("" for a bare state_dict)
    tensors: int = 0
    params: int = 0
    dtypes: dict[str, int] = {}
    nonfinite: dict[str, NonFinite] = {}  # per tensor name, those with any (weights, optimizer state)
    # Non-finite values in metadata (Lightning's ModelCheckpoint kth_value, a scheduler, RNG state):
    # reported, never a rejection.
    nonfinite_metadata: dict[str, NonFinite] = {}
    outliers: list[Outlier] = []  # the widest first
    arch: Arch = msgspec.field(default_factory=Arch)
    arch_mismatch: list[ArchMismatch] = []
    stds: dict[str, float] = {}  # per model tensor: what the next checkpoint is compared with
    refused_types: list[str] = []
    error_chain: list[p.ErrorLink] = []
    ram: RamNeed | None = None
    deferred: bool = False
    seconds: float = 0.0
    framework: str | None = None  # hugging-face | lightning | dcp | nanogpt, when the layout says
    step_source: str | None = None  # where `step` was read: trainer_state.json, global_step, the name...
    files: list[FileVerdict] = []  # a directory checkpoint's files, each checked
    notes: list[str] = []  # what was found and reported, not rejected
    # What it holds of a faithful resume (model, optimizer, scheduler, RNG, data position...),
    # read from what the load already gave: None where the load did not get that far.
    completeness: Completeness | None = None


def failure_report(path: str | os.PathLike[str], reason: str, *, deferred: bool = False) -> VerifyReport:
    """A report for a verification that could not run to the end (timeout, verifier died)."""
    return VerifyReport(path=str(path), reason=reason, problems=[reason], deferred=deferred)


def decode_expected(data: str | bytes | Mapping[str, object] | None) -> Expected | None:
    """What a file must match, as a person wrote it (`--expect-json`) or a client sent it (the
    keeper's verify action). ValueError, one line to put after the source's name, when it is
    not an object of that shape."""
    if data is None or data in ("", b""):
        return None
    try:
        if isinstance(data, (str, bytes)):
            return msgspec.json.decode(data, type=Expected)
        return msgspec.convert(data, Expected)
    except msgspec.ValidationError as exc:  # (a DecodeError's subclass: first)
        raise ValueError(
            f"must be a JSON object of digest, size_bytes, step, arch, previous ({exc})"
        ) from None
    except msgspec.DecodeError as exc:
        raise ValueError(f"is not JSON: {exc}") from None


def journal_report(
    report: VerifyReport, *, promoted_dir: str | None = None, promoted_file: str | None = None
) -> p.CheckpointReport:
    """The verdict in brief, for the journal (the per-tensor figures stay in the manifest or the
    candidate's .verify.json: the journal stays small)."""
    return p.CheckpointReport(
        ok=report.ok,
        reason=report.reason,
        problems=list(report.problems),
        format=report.format,
        tensors=report.tensors,
        params=report.params,
        digest_ok=report.digest_ok,
        deferred=report.deferred,
        seconds=report.seconds,
        refused_types=list(report.refused_types),
        error_chain=list(report.error_chain),
        notes=list(report.notes),
        promoted_dir=promoted_dir,
        promoted_file=promoted_file,
        completeness=report.completeness,
    )
