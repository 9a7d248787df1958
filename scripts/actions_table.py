"""Write the action registry's table into docs/actions.md, between its `<!-- actions:begin -->`
and `<!-- actions:end -->` markers (tests/unit/test_action_registry.py checks they agree).

    python scripts/actions_table.py
"""

from __future__ import annotations

from pathlib import Path

from trainroom.core.actions.registry import markdown_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "actions.md"
BEGIN, END = "<!-- actions:begin -->\n", "<!-- actions:end -->"


def main() -> int:
    text = DOCS.read_text()
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    DOCS.write_text(head + BEGIN + markdown_table() + END + tail)
    print(f"wrote the actions table into {DOCS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
