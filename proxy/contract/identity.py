"""What a request says about its session (``Identity``), and the hints of its call, as the call
path carries it: proxy/sessions/identity.py reads it from a request's headers and body."""

from __future__ import annotations

from dataclasses import dataclass

from talaria.core.types import Priority


@dataclass(frozen=True)
class Identity:
    """What a request says about its session. ``session_id`` is the client's id (or a key the
    proxy sent back, which the book also accepts), never looked up here; None: implicit."""

    session_id: str | None
    source: str
    """Where the id came from ("talaria", "claude-code", "codex", "prompt_cache_key",
    "x-session-id", "x-litellm-session-id", "litellm_session_id"), or "implicit"."""
    parent_session_id: str | None = None
    """The parent's id as the client gave it (module docstring: which headers)."""
    tool_gap_hint_s: float | None = None
    """Tool time expected after this call, seconds (the header is in milliseconds)."""
    final: bool = False
    family_id: str | None = None
    """The id a family of sessions is placed by among replicas (proxy/cluster/owner.py):
    the agent's own session id for its sub-agents, else the named parent, else the id."""
    priority: Priority | None = None
    """The call's class as ``X-Talaria-Priority`` says (None: its API key's)."""
    deadline_s: float | None = None
    """``X-Talaria-Deadline-S``: wall seconds after its arrival by which the call should be
    done (None: no deadline)."""
    agent: str = ""
    """The agent's kind (proxy/sessions/identity.py ``agent_kind``): its ``User-Agent``'s
    product name, else ``source``; the node learns tool gaps per (tenant, model, agent)."""

    @property
    def placed_by(self) -> str | None:
        """``family_id`` when set, else the session's id (None: implicit)."""
        return self.family_id or self.parent_session_id or self.session_id

    @property
    def explicit(self) -> bool:
        """The request named its session (``session_id`` is not None)."""
        return self.session_id is not None
