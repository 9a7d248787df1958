"""JSON for scripts: the one encoder is `units.to_json` (strict JSON; a non-finite figure is
null), named here for the commands that print it."""

from __future__ import annotations

from trainroom.core.units import json_safe, to_json

__all__ = ["json_safe", "to_json"]
