"""Public name of the non-finite tracer (`trainroom.core.tracer.NonFiniteTracer`); the code lives
in `trainroom.core.sdk.tracer`. Nothing inside trainroom imports this module (a test checks)."""

from trainroom.core.sdk.tracer import NonFiniteTracer

__all__ = ["NonFiniteTracer"]
