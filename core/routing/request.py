"""What routing is asked: the call's ``RouteRequest``, and the error when nothing can serve it."""

from __future__ import annotations

from dataclasses import dataclass


class NoInstanceError(LookupError):
    """No instance hosts the requested model."""


@dataclass(frozen=True)
class RouteRequest:
    """What routing knows about a call: its session and model, its prompt size, where the
    session's previous call ran (``last_instance``) and where its live proxy-level soft
    reservation is (``reserved_instance``, None when it has none or it expired)."""

    session_key: str
    model: str
    prompt_tokens: int
    last_instance: str | None = None
    reserved_instance: str | None = None
