"""JSON for scripts: strict JSON, whatever the figures. A non-finite float (a NaN loss, an
unmeasured ratio) is `null`, never the `NaN` / `Infinity` that json.dumps writes and no JSON
parser reads; a figure where the value itself matters (the loss) carries it as a string beside."""

from __future__ import annotations

import json
import math
from typing import Any

# Keys whose non-finite value is worth keeping as text next to the null (`loss_raw: "nan"`).
RAW_KEYS = frozenset({"loss"})


def json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in RAW_KEYS and isinstance(v, (float, str)) and not _finite(v):
                out[f"{k}_raw"] = str(v) if isinstance(v, str) else _word(v)
                out[k] = None
            else:
                out[k] = json_safe(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _finite(v: float | str) -> bool:
    if isinstance(v, str):
        return v not in ("nan", "inf", "-inf")
    return math.isfinite(v)


def _word(v: float) -> str:
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def to_json(obj: Any) -> str:
    return json.dumps(json_safe(obj), indent=2, default=str, allow_nan=False)
