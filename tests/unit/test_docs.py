"""The docs hold what the code holds: the layer map in docs/architecture.md is the one
scripts/layer_map.py renders from pyproject.toml's import-linter contracts, every relative link in
README.md and docs/*.md reaches a file (and a heading, when it names one), and the README's test
command is the one CI runs."""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages linked before they exist in this tree; empty once they do (a link to one that exists is
# checked like any other).
PENDING: set[str] = set()


def _layer_map() -> ModuleType:
    spec = importlib.util.spec_from_file_location("layer_map", ROOT / "scripts" / "layer_map.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("layer_map", module)
    spec.loader.exec_module(module)
    return module


def _findings_table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("findings_table", ROOT / "scripts" / "findings_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("findings_table", module)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- the finding catalogue


def test_findings_holds_the_catalogue_table() -> None:
    ft = _findings_table()
    doc = (ROOT / "docs" / "findings.md").read_text()
    assert ft.block(doc) == ft.current(), (
        "docs/findings.md is stale: run `python scripts/findings_table.py --write`"
    )


def test_the_findings_table_would_see_a_changed_catalogue() -> None:
    ft = _findings_table()
    doc = (ROOT / "docs" / "findings.md").read_text()
    stale = doc.replace("| DEAD | the trainer died", "| DEAD | the trainer stopped", 1)
    assert stale != doc and ft.block(stale) != ft.current()


def test_the_finding_codes_are_the_catalogue_s_keys() -> None:
    """A code is entered once (its catalogue line): the `FindingCode` Literal mypy checks codes
    against is written from the catalogue's keys, and a stale one is seen."""
    ft = _findings_table()
    vocab = (ROOT / "src" / "trainroom" / "core" / "vocab.py").read_text()
    held = ft.block(vocab, ft.CODES_BEGIN, ft.CODES_END)
    assert held == ft.codes(), (
        "vocab.py's FindingCode is stale: run `python scripts/findings_table.py --write`"
    )
    assert held.count('",\n') == len(ft.CATALOGUE) > 30
    stale = vocab.replace('    "DEAD",\n', "", 1)
    assert stale != vocab and ft.block(stale, ft.CODES_BEGIN, ft.CODES_END) != ft.codes()


def test_write_rewrites_the_codes_from_the_catalogue(tmp_path: Path) -> None:
    ft = _findings_table()
    copy = tmp_path / "vocab.py"
    vocab = (ROOT / "src" / "trainroom" / "core" / "vocab.py").read_text()
    copy.write_text(vocab.replace('    "HUNG",\n', '    "HUNG",\n    "NOT_IN_THE_CATALOGUE",\n', 1))
    assert ft.write(copy, ft.CODES_BEGIN, ft.CODES_END, ft.codes())
    assert copy.read_text() == vocab


# ---------------------------------------------------------------------------- the layer map


def test_architecture_holds_the_layer_map_pyproject_gives() -> None:
    lm = _layer_map()
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert lm.block(doc) == lm.current(), "the layer map is stale: run `python scripts/layer_map.py --write`"


def test_the_map_names_every_layer_of_every_layers_contract() -> None:
    lm = _layer_map()
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert layered  # else this would prove nothing
    rendered = lm.current()
    for contract in layered:
        for layer in contract["layers"]:
            for name in re.split(r"[|:]", layer):
                assert f"`{name.strip().strip('()').strip()}`" in rendered, name
    for contract in contracts:
        assert contract["name"] in rendered


def test_siblings_and_optional_layers_are_said_in_words() -> None:
    lm = _layer_map()
    text = lm.render(
        {
            "tool": {
                "importlinter": {
                    "contracts": [
                        {
                            "name": "l",
                            "type": "layers",
                            "containers": ["p"],
                            "layers": ["a", "b | (c)", "d : e"],
                        },
                        {
                            "name": "f",
                            "type": "forbidden",
                            "source_modules": ["p"],
                            "forbidden_modules": ["x"],
                        },
                    ]
                }
            }
        }
    )
    assert "| 1 | `a` |  |" in text
    assert "| 2 | `b` · `c` (optional) | independent: none imports another |" in text
    assert "| 3 | `d` · `e` | may import each other |" in text
    assert "- **f**: `p` may not import `x`." in text


def test_write_replaces_only_what_lies_between_the_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lm = _layer_map()
    doc = tmp_path / "architecture.md"
    doc.write_text(f"# before\n{lm.BEGIN}\nstale map\n{lm.END}\nafter\n")
    assert lm.write(doc) is True
    text = doc.read_text()
    assert text.startswith("# before\n") and text.endswith(f"{lm.END}\nafter\n")
    assert "stale map" not in text and lm.block(text) == lm.current()
    assert lm.write(doc) is False  # a second run changes nothing
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        lm.write(doc)


# ---------------------------------------------------------------------------- links

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str, *, spans: bool = False) -> str:
    """The text outside fenced code blocks, and outside inline code spans unless `spans`."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line if spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(lines)


def _anchors(path: Path) -> set[str]:
    """The heading anchors a renderer makes (GitHub's rule: lower case, punctuation dropped,
    spaces to hyphens, a repeat numbered)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(), spans=True).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    text = path.read_text()
    # Inline code is dropped, but a link whose text is code (`[`x`](y)`) must still count.
    text = re.sub(r"\[`([^`\]]*)`\]", r"[\1]", text)
    return LINK.findall(_prose(text))


def test_the_docs_were_found() -> None:
    assert len(DOCS) > 10 and all(d.exists() for d in DOCS)
    assert sum(len(_links(d)) for d in DOCS) > 30  # the link reader reads links


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists() and str(dest.relative_to(ROOT)) not in PENDING:
            broken.append(f"{target}: no such file")
        elif anchor and dest.exists() and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == [], f"{doc.relative_to(ROOT)}: {broken}"


def test_a_broken_link_and_a_missing_heading_are_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A title, `code` here\n\n## A title, code here\n")
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#a-title-code-here-1) [gone](nowhere.md) ```[in code](x.md)```\n")
    assert _links(doc) == ["a.md#a-title-code-here-1", "nowhere.md"]
    assert _anchors(tmp_path / "a.md") == {"a-title-code-here", "a-title-code-here-1"}


# ---------------------------------------------------------------------------- the two commands


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    command = next(line for line in ci if "pytest" in line and not line.lstrip().startswith("#"))
    assert command.strip() in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------------------- history words

# Words that tell how the work was organised instead of why the code is so: the failure stories
# by a private name (they are docs/scenarios.md's numbered scenarios), waves, rounds, issue numbers,
# whoever asked, and other projects named as the reason for a choice. A project a user knows may
# still be named as the user's expectation ("k9s kills with ctrl+k").
# history-words:begin
HISTORY_WORDS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bthe seed(?:'s|s)\b",
        r"\bthe seed\s*(?:[:)]|$)",
        r"\bas (?:in )?the seed\b",
        r"\bseed[- ]?0\d\d\b",
        r"\bseed stor(?:y|ies)\b",
        r"\bwaves?\s*\d+\b|\(wave\b",
        r"\bissues?\s*#?\d+(?:\.\d+)?\b|\(issue\b",
        r"\bthe lead(?:'s)?\b",
        r"\bround\s+(?:2|two|3|three)\b",
        r"\b(?:harlequin|dolphie|toolong|circus)\b",
        r"\b(?:posting|supervisor|nvitop|btop|k9s|lazygit|textual)'s (?:way|model)\b",
    )
]
# history-words:end
SCANNED = ("src", "tests", "scripts")
SUFFIXES = {".py", ".tcss", ".toml", ".txt", ".md", ".sh", ".cfg"}


def _history_hits(root: Path) -> list[str]:
    hits = []
    this = Path(__file__).resolve()
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            skipping = False
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
                if path.resolve() == this and "history-words:" in line:
                    skipping = "history-words:begin" in line
                    continue
                if skipping:
                    continue
                if any(p.search(line) for p in HISTORY_WORDS):
                    hits.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return hits


def test_no_history_words_in_sources_tests_or_scripts() -> None:
    hits = _history_hits(ROOT)
    assert hits == [], "say why in the code's own terms:\n" + "\n".join(hits)


def test_the_history_scan_finds_each_kind_and_spares_legitimate_words(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text(
        "x = 1  # the seed's disk guard\n"
        "# seed-004 bug\n"
        "# what moved where (wave 2)\n"
        "# (issue 4.6)\n"
        "# the lead's boundary\n"
        "# round 2 of the work\n"
        "# harlequin's way\n"
        "# as in dolphie; posting's way\n"
        "torch.manual_seed(args.seed)  # the RNG seed, and --seed 7\n"
        "# the leader of the process group; k9s kills with ctrl+k; a checkpoint's way, the Trainer's way\n"
    )
    hits = _history_hits(tmp_path)
    assert [h.split(":")[1] for h in hits] == ["1", "2", "3", "4", "5", "6", "7", "8"]
