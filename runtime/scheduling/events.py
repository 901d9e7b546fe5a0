"""The node's session events, which every policy object receives (``SessionEvents``: each hook
a no-op by default), and the fan-out that hands each event to all of them.

Anything a node keeps per session or per call outside the session table listens here, so
that it forgets what a session left when the node forgets the session (``session_ended``): a
policy's state per session ends with the session by construction, not by a call someone
remembered to add (the fair queue's service accounts once grew with every session ever
served, issue 47).
"""

from __future__ import annotations

from collections.abc import Sequence

from talaria.core.types import CallRequest


class SessionEvents:
    """The node's session events; each hook does nothing unless a policy needs it."""

    def call_admitted(self, request: CallRequest, estimate_s: float) -> None:
        """The call was admitted into its engine, its service estimated at ``estimate_s``."""

    def call_ended(self, request: CallRequest, estimate_s: float, measured_s: float) -> None:
        """An admitted call ended (``measured_s``: its admitted-to-finished seconds; a call that
        failed or was abandoned: its estimate)."""

    def session_ended(self, session_key: str) -> None:
        """The node forgets the session (it ended, its model left, or it idled out): drop
        everything kept for it."""


class EventFanout(SessionEvents):
    """Hands every event to each listener, in order."""

    def __init__(self, listeners: Sequence[SessionEvents]) -> None:
        self.listeners = tuple(listeners)

    def call_admitted(self, request: CallRequest, estimate_s: float) -> None:
        for listener in self.listeners:
            listener.call_admitted(request, estimate_s)

    def call_ended(self, request: CallRequest, estimate_s: float, measured_s: float) -> None:
        for listener in self.listeners:
            listener.call_ended(request, estimate_s, measured_s)

    def session_ended(self, session_key: str) -> None:
        for listener in self.listeners:
            listener.session_ended(session_key)
