"""Cause and consequence among the open findings: the rows every client shows them in.

A finding whose cause is open (`vocab.FOLLOWS`: a checkpoint of a NaN model rejected while
NONFINITE is open) is folded under that cause as one line with a count ("14 checkpoints
rejected since NONFINITE at step 31"); the open findings of one code are one line with their
count and the newest in words; a cause's own cause is followed to the root, so each row is a root
cause with everything that follows from it. Rows are ordered as findings are (`findings.order`):
the most severe first (a row is as severe as the worst finding in it), then the newest root; a
row whose fix another's waits on (`vocab.STANDS_IN_THE_WAY`) comes before that one.

Pure: the control room, `trainroom status` and its JSON read the same rows.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainroom.core.findings import SEVERITY_RANK, Finding
from trainroom.core.vocab import COUNTED, FINDING_CODES, FOLLOWS, STANDS_IN_THE_WAY, FindingCode, Severity

# The codes some other code may follow from: their findings fold as one (they are never told
# apart by evidence), under the cause of the first of them.
_CAUSES: frozenset[str] = frozenset(link.cause for links in FOLLOWS.values() for link in links)
_CODE_ORDER = {c: i for i, c in enumerate(FINDING_CODES)}


@dataclass(frozen=True)
class Kind:
    """The open findings of one code that show as one line, the newest first."""

    findings: tuple[Finding, ...]

    @property
    def head(self) -> Finding:
        return self.findings[0]

    @property
    def code(self) -> FindingCode:
        return self.head.code

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def severity(self) -> Severity:
        return _worst(f.severity for f in self.findings)

    @property
    def first_seen(self) -> float:
        return min(f.first_seen for f in self.findings)

    def counted(self) -> str:
        """How many, in words: "14 checkpoints rejected", "3 × SLOW", or the code alone for one."""
        return counted(self.code, self.count)

    def said(self) -> str:
        """The line's words: the finding's own for one, else how many and the newest."""
        if self.count == 1:
            return self.head.message
        many = self.counted() if self.code in COUNTED else f"{self.count} open"
        return f"{many}; the latest: {self.head.message}"


@dataclass(frozen=True)
class Row:
    """A root cause (one code's findings) and what follows from it, one kind a line, in the
    order they were first seen."""

    cause: Kind
    consequences: tuple[Kind, ...] = ()

    @property
    def head(self) -> Finding:
        """The finding the row stands for: its fix key and its detail."""
        return self.cause.head

    @property
    def severity(self) -> Severity:
        return _worst(k.severity for k in (self.cause, *self.consequences))

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for k in (self.cause, *self.consequences) for f in k.findings)

    @property
    def idents(self) -> tuple[str, ...]:
        return tuple(f.ident for f in self.findings)

    def since(self, k: Kind) -> str:
        """One consequence in words: "14 checkpoints rejected since NONFINITE at step 31"."""
        step = _began(list(self.cause.findings))[0]
        at = f" at step {step}" if step is not None else ""
        return f"{k.counted()} since {self.cause.code}{at}"

    def consequence_line(self, k: Kind) -> str:
        """A consequence's line: how many since the cause, and the newest in words."""
        return f"{self.since(k)}; the latest: {k.head.message}"


def counted(code: FindingCode, n: int) -> str:
    words = COUNTED.get(code)
    if words is not None:
        return f"{n} {words[0] if n == 1 else words[1]}"
    return code if n == 1 else f"{n} × {code}"


def fold(findings: Iterable[Finding]) -> list[Row]:
    """The open findings as rows: each root cause with what follows from it, repeats of one
    code one kind; the most severe row first, then the newest.

    A consequence folds only under a cause that began before it: by the step each names (its
    evidence's `step`: where a spike or a divergence began, the step a checkpoint was saved at),
    then, where a step is missing on either side or the two are equal, by when each was first
    seen. Of the causes that qualify, the one that began first is its cause."""
    fs = list(findings)
    by_code: dict[FindingCode, list[Finding]] = {}
    for f in fs:
        by_code.setdefault(f.code, []).append(f)
    began = {c: _began(xs) for c, xs in by_code.items()}

    def cause_of(code: FindingCode, onset: Onset, evidence: dict[str, object] | None) -> FindingCode | None:
        best: FindingCode | None = None
        for link in FOLLOWS.get(code, ()):
            c = link.cause
            if c == code or c not in by_code:
                continue
            if link.shown_by is not None and (evidence is None or link.shown_by not in evidence):
                continue
            if link.after and not _before(c, began[c], code, onset):
                continue  # began after it: not its doing
            if best is None or _before(c, began[c], best, began[best]):
                best = c
        return best

    def root_of(code: FindingCode) -> FindingCode:
        path = [code]
        while (up := cause_of(path[-1], began[path[-1]], None)) is not None and up not in path:
            path.append(up)
        return path[-1]

    # Each finding's row (its root cause's code) and its kind there (its own code).
    placed: dict[FindingCode, dict[FindingCode, list[Finding]]] = {}
    for f in fs:
        if f.code in _CAUSES:
            up = cause_of(f.code, began[f.code], None)
        else:
            up = cause_of(f.code, _onset(f), f.evidence)
        root = root_of(up) if up is not None else f.code
        if root == f.code:
            up = None
        placed.setdefault(f.code if up is None else root, {}).setdefault(f.code, []).append(f)
    rows = []
    for root, kinds in placed.items():
        # A row's root has findings of its own there: a finding of the root's code walks the same
        # causes root_of walked to reach it, and so ends at itself.
        own = kinds.pop(root)
        rest = _in_time_order([_kind(xs) for xs in kinds.values()])
        rows.append(Row(cause=_kind(own), consequences=tuple(rest)))
    rows.sort(key=lambda r: (-SEVERITY_RANK.get(r.severity, 0), -r.head.first_seen, r.cause.code))
    return _fixes_first(rows)


def _fixes_first(rows: list[Row]) -> list[Row]:
    """`rows` with each row that stands in the way of another's fix (`vocab.STANDS_IN_THE_WAY`:
    the reclaim an ENOMEM death needs before its resume) moved just above the first row it
    stands in the way of; the rest keep their order."""
    out = list(rows)
    for row in rows:
        blocked = STANDS_IN_THE_WAY.get(row.cause.code, ())
        at = next((i for i, r in enumerate(out) if r.cause.code in blocked), None)
        if at is not None and out.index(row) > at:
            out.remove(row)
            out.insert(at, row)
    return out


def _kind(xs: list[Finding]) -> Kind:
    return Kind(tuple(sorted(xs, key=lambda f: (-f.first_seen, f.ident))))


# When a finding began: the step it names (None: it names none), and when it was first seen.
Onset = tuple[int | None, float]


def _step(f: Finding) -> int | None:
    step = f.evidence.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _onset(f: Finding) -> Onset:
    return (_step(f), f.first_seen)


def _began(xs: list[Finding]) -> Onset:
    """When the first of one code's findings began: its earliest step and earliest sighting."""
    steps = [s for s in map(_step, xs) if s is not None]
    return (min(steps) if steps else None, min(f.first_seen for f in xs))


def _in_time_order(kinds: list[Kind]) -> list[Kind]:
    """Kinds in the order they began: by first sighting, then those that name a step put in step
    order among the places they hold (a checkpoint of step 100 judged after the spike of step 101
    is listed before it; a kind without a step keeps its place by time)."""
    out = sorted(kinds, key=lambda k: (k.first_seen, k.code))
    slots = [i for i, k in enumerate(out) if _began(list(k.findings))[0] is not None]
    stepped = sorted((out[i] for i in slots), key=lambda k: (_began(list(k.findings))[0] or 0, k.first_seen))
    for i, k in zip(slots, stepped, strict=True):
        out[i] = k
    return out


def _before(a: FindingCode, a_on: Onset, b: FindingCode, b_on: Onset) -> bool:
    """Whether `a` began before `b`: by step where both name one and they differ, else by when
    each was first seen (the same moment: the one the catalogue lists first)."""
    (a_step, a_seen), (b_step, b_seen) = a_on, b_on
    if a_step is not None and b_step is not None and a_step != b_step:
        return a_step < b_step
    return (a_seen, _CODE_ORDER.get(a, 0)) < (b_seen, _CODE_ORDER.get(b, 0))


def _worst(severities: Iterable[Severity]) -> Severity:
    return max(severities, key=lambda s: SEVERITY_RANK.get(s, 0))
