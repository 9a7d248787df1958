"""The vocabulary: the catalogue covers every code a rule raises, the groups read off it are the
ones the keeper and the control room used, every directory checkpoint format is recognised and
verified, and a record of a newer version with a word this one does not know is skipped and
counted by the reader, never a crash."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, cast, get_args

import msgspec
import pytest

from trainroom.core import vocab
from trainroom.core.ckpt import dirs, targets
from trainroom.core.findings import Finding
from trainroom.core.health import sanity, watchdog
from trainroom.core.journal.file import Journal, read_journal
from trainroom.core.notify import alert
from trainroom.core.run import summary
from trainroom.core.run.state import RunState
from trainroom.core.run.view import RunView
from trainroom.core.wire import protocol as p

SRC = Path(__file__).resolve().parents[2] / "src" / "trainroom"


def test_the_catalogue_has_every_code_once_and_nothing_else() -> None:
    assert list(vocab.CATALOGUE) == list(vocab.FINDING_CODES)
    assert len(set(vocab.FINDING_CODES)) == len(vocab.FINDING_CODES)


def test_every_code_has_its_panel_family_and_doc_line() -> None:
    """What a new code must bring, whatever the count: a family, a severity, a one-line meaning
    the docs table shows (docs/findings.md is generated from it), a known panel or none (the
    findings list), and an alert state that is one."""
    doc = (SRC.parents[1] / "docs" / "findings.md").read_text()
    for code, kind in vocab.CATALOGUE.items():
        assert re.fullmatch(r"[A-Z][A-Z_]+", code), code
        assert kind.family in get_args(vocab.Family), code
        assert kind.severity in vocab.SEVERITIES, code
        assert kind.means and "\n" not in kind.means and "|" not in kind.means, code
        assert kind.panel is None or kind.panel in vocab.PANELS, code
        assert kind.alerted_as is None or kind.alerted_as in vocab.ALERT_STATES, code
        assert f"| {code} | {kind.means} |" in doc, f"{code}: run `python scripts/findings_table.py --write`"


def test_every_code_a_source_file_raises_is_in_the_catalogue() -> None:
    raised = set()
    for f in SRC.rglob("*.py"):
        raised |= set(re.findall(r'\bcode="([A-Z][A-Z_]+)"', f.read_text()))
    raised -= {"TEST", "DIGEST"}  # an alert's own codes (`notify --test`, a digest), not findings
    assert len(raised) > 25  # the scan found the rules, or this would prove nothing
    assert raised <= set(vocab.FINDING_CODES), raised - set(vocab.FINDING_CODES)
    assert set(vocab.FINDING_CODES) <= raised, "a catalogued code no rule raises"


def test_the_groups_are_read_off_the_catalogue() -> None:
    """Each group the keeper and the control room use is the catalogue's (so a new code joins by
    its catalogue line), and still holds the codes it was made for."""
    cat = vocab.CATALOGUE
    assert {c for c, k in cat.items() if k.volatile} == watchdog.VOLATILE
    assert {"STALLED", "HUNG", "SLOW", "GHOST_MEMORY", "HOST_RAM_LOW", "ORPHAN_CONTEXT"} <= watchdog.VOLATILE
    assert tuple(sanity.CODES) == tuple(c for c, k in cat.items() if k.family == "sanity")
    assert {
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
    } <= set(sanity.CODES)
    assert {c for c, k in cat.items() if k.alerted_as} == alert.STATE_FINDINGS
    assert {"DEAD", "HUNG", "STALLED"} <= alert.STATE_FINDINGS
    # Each finding alerted as a state shares its alert with that state, spelt in capitals.
    for code in alert.STATE_FINDINGS:
        kind = vocab.CATALOGUE[code]
        assert kind.alerted_as is not None and alert.state_ident(kind.alerted_as) == code
    for panel in vocab.PANELS:
        assert vocab.PANEL_CODES[panel] == tuple(c for c, k in cat.items() if k.panel == panel)
    assert {"GHOST_MEMORY", "ORPHAN_CONTEXT"} <= set(vocab.PANEL_CODES["vram"])
    assert "LR_MISMATCH" in vocab.PANEL_CODES["lr"]
    assert "HOST_RAM_LOW" in vocab.PANEL_CODES["host"]
    assert {"DISK_HIGH", "DISK_FULL_SOON", "CKPT_REJECTED"} <= set(vocab.PANEL_CODES["disk"])
    assert {"LOSS_SPIKE", "DIVERGENCE", "NONFINITE"} <= set(vocab.PANEL_CODES["loss"])


def test_the_state_sets_nest() -> None:
    assert set(watchdog.STATES) < set(vocab.STATE_NAMES) < set(vocab.SHOWN_STATES) < set(vocab.NODE_STATES)
    assert set(vocab.ALERT_STATES) <= set(vocab.WATCH_STATES)
    assert set(vocab.DIR_KINDS) <= set(vocab.CKPT_FORMATS)
    assert vocab.SEVERITY_RANK == {"info": 0, "warning": 1, "critical": 2}


def test_every_directory_format_is_recognised_and_verified_once() -> None:
    kinds = [f.kind for f in targets.DIR_FORMATS]
    assert sorted(kinds) == sorted(vocab.DIR_KINDS)
    assert set(dirs.VERIFIERS) == set(vocab.DIR_KINDS)


def test_directory_kinds_are_told_apart_by_the_registry(tmp_path: Path) -> None:
    hf = tmp_path / "checkpoint-40"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"")
    dcp = tmp_path / "step-40"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"")
    (dcp / "model.safetensors").write_bytes(b"")  # an HF marker too: DCP's metadata decides first
    plain = tmp_path / "logs"
    plain.mkdir()
    assert targets.kind_of(hf) == "hf-checkpoint" and targets.kind_of(dcp) == "dcp-checkpoint"
    assert targets.dir_kind(plain) is None and targets.kind_of(plain) == "other"
    assert targets.kind_of(tmp_path) == "root" and targets.units_in(tmp_path) == [hf, dcp]


def _future(word: str) -> Any:
    """A word of a newer trainroom: the constructors do not check, the decoder does."""
    return cast(Any, word)


def test_a_journal_record_with_an_unknown_word_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "journal.msgpack"
    j = Journal(path)
    known = Finding(code="SLOW", severity="warning", message="slow")
    j.append(p.FindingRaised(finding=known))
    j.append(p.FindingRaised(finding=Finding(code=_future("QUANTUM_FLUX"), severity="warning", message="?")))
    j.append(p.RunStatus(t=1.0, state=_future("levitating")))
    j.append(p.CheckpointState(path="/c", step=1, state=_future("teleported"), t=1.0))
    j.append(p.RunStatus(t=2.0, state="running", reason="steps flowing"))
    j.close()
    st = RunState(run_id="r", argv=[], cwd="/", created=0.0)
    for rec in read_journal(path):
        st.apply(rec)
    assert st.journal_damage.unknown_records == 3 and st.journal_damage.regions == 0
    assert [f.code for f in st.findings.values()] == ["SLOW"]
    assert st.status == "running" and st.checkpoints == []


def test_a_summary_with_an_unknown_word_is_not_used(tmp_path: Path) -> None:
    """A reader falls back to the journal (summary.read says None), it does not crash."""
    good = summary.RunSummary(run_id="r", created=0.0, status="exited")
    summary.write(tmp_path, good)
    assert summary.read(tmp_path) == good
    summary.write(tmp_path, summary.RunSummary(run_id="r", created=0.0, status=_future("levitating")))
    assert summary.read(tmp_path) is None
    worst = summary.WorstFinding(code=_future("QUANTUM_FLUX"), severity="warning", message="?")
    summary.write(tmp_path, summary.RunSummary(run_id="r", created=0.0, status="dead", worst=worst))
    assert summary.read(tmp_path) is None


def test_a_snapshot_with_an_unknown_word_raises_the_error_remote_readers_catch() -> None:
    """A remote node's snapshot from a newer trainroom: `read_node` and `_remote_view` catch
    exactly msgspec.ValidationError and report the node, not a traceback."""
    st = RunState(run_id="r", argv=[], cwd="/", created=0.0)
    st.apply(p.FindingRaised(finding=Finding(code="SLOW", severity="warning", message="slow")))
    snap = RunView(st).to_snapshot()
    assert RunView.from_snapshot(snap).state.findings.keys() == {"SLOW"}
    snap.state["findings"]["SLOW"]["code"] = "QUANTUM_FLUX"
    with pytest.raises(msgspec.ValidationError):
        RunView.from_snapshot(snap)


def test_action_names_are_the_registry_s() -> None:
    """`vocab.ActionName` (what mypy checks a finding's or an alert's action against) names every
    action the registry serves, in its order, and nothing else."""
    from trainroom.core.actions import registry

    assert vocab.ACTION_NAMES == registry.NAMES
    assert all(spec.name in vocab.ACTION_NAMES for spec in registry.SPECS)


def _literal_faults(text: str, where: str, seen: dict[frozenset[object], str]) -> list[str]:
    """Outside vocab.py a `Literal[...]` is only the value of a module-level alias (`Name =
    Literal[...]`), never written inline on a field or a parameter; and no two aliases anywhere
    hold the same words (`seen`: each set of words and where it was first named)."""
    faults = []
    tree = ast.parse(text)
    aliases: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            aliases[id(node.value)] = node.targets[0].id
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Literal"
        ):
            continue
        name = aliases.get(id(node))
        if name is None:
            if not where.endswith("core/vocab.py"):
                faults.append(f"{where}:{node.lineno}: an inline Literal: name it (in core/vocab.py)")
            continue
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        words = frozenset(e.value for e in elts if isinstance(e, ast.Constant))
        if words and len(words) == len(elts):
            if words in seen:
                faults.append(f"{where}:{node.lineno}: {name} repeats {seen[words]}")
            seen.setdefault(words, f"{where}:{name}")
    return faults


def test_each_vocabulary_is_named_once() -> None:
    seen: dict[frozenset[object], str] = {}
    faults = []
    files = sorted(SRC.rglob("*.py"), key=lambda f: f.name != "vocab.py")  # vocab's names first
    for f in files:
        faults += _literal_faults(f.read_text(), str(f.relative_to(SRC)), seen)
    assert len(seen) > 30  # the scan found the vocabularies, or this would prove nothing
    assert faults == []


def test_the_vocabulary_check_sees_an_inline_or_a_repeated_set() -> None:
    seen: dict[frozenset[object], str] = {}
    planted = 'Mine = Literal["alive", "busy", "gone"]\n\nclass C:\n    via: Literal["a", "b"] | None\n'
    assert _literal_faults(VOCAB_TEXT, "core/vocab.py", seen) == []
    faults = _literal_faults(planted, "core/x.py", seen)
    assert len(faults) == 2, faults
    assert "Mine repeats core/vocab.py:KeeperWord" in faults[0] and "inline Literal" in faults[1]


VOCAB_TEXT = (SRC / "core" / "vocab.py").read_text()


def test_records_an_older_keeper_wrote_decode_with_the_typed_words() -> None:
    """Every word the fields typed here were ever written with (the action names, a note's
    kinds, an alert's kinds, outcomes and severities, a worker's end) still decodes, from the
    raw msgpack an older keeper wrote; words that stay open (a request's action) keep any word."""
    older: list[dict[str, Any]] = [
        {"type": "finding", "finding": {"code": "HUNG", "severity": "critical", "message": "m", "action": a}}
        for a in ("kill", "reclaim", "prune", "resume", "dump", "continue", "verify", "bench")
    ]
    older += [
        {"type": "attempt-stopping", "n": 1, "t": 1.0, "by": "cli pid 4", "until": 9.0, "action": "kill"},
        {
            "type": "notify",
            "t": 1.0,
            "channel": "c",
            "outcome": "held",
            "kind": "digest",
            "severity": "warning",
        },
        {"type": "notify", "t": 1.0, "channel": "c", "outcome": "unavailable"},  # no severity
        {"type": "batches", "t": 1.0, "code": "LOSS_SPIKE", "ident": "LOSS_SPIKE", "attempt": 1},
        {"type": "keeper-note", "t": 1.0, "message": "m", "kind": "internal-error"},
        {"type": "action", "action": "notify-test", "t": 1.0, "ok": True, "message": "m"},
        {"type": "worker-ended", "attempt": 1, "t": 1.0, "pid": 5, "rank": 0, "source": "launcher"},
    ]
    decoded = [p.record_decoder.decode(msgspec.msgpack.encode(raw)) for raw in older]
    assert [type(r).__name__ for r in decoded[-7:]] == [
        "AttemptStopping",
        "NotifyResult",
        "NotifyResult",
        "BatchLog",
        "KeeperNote",
        "ActionRecord",
        "WorkerEnded",
    ]
    assert [cast(p.FindingRaised, r).finding.action for r in decoded[:8]] == list(vocab.ACTION_NAMES)
    assert cast(p.NotifyResult, decoded[10]).severity is None
    reply = {"type": "reply", "id": 1, "action": "cancel", "stage": "done", "ok": False}
    assert cast(p.Reply, p.keeper_decoder.decode(msgspec.msgpack.encode(reply))).action == "cancel"
