"""`trainroom job`: placeholder, filled in below."""

from __future__ import annotations

from typing import Any


def add_parser(sub: Any) -> None:
    pass
