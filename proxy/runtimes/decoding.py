"""What a runtime server's answers say, as its HTTP client (http.py ``HttpRuntime``) reads them:

- a call's stream: NDJSON lines (``ndjson_lines``), each a generation event of
  core/protocol_events.py (``decode_event``), an error event raised as the caller's fault or
  the runtime's;
- its status document (``StatusReader``): the JSON, an entry that does not decode (NaN or
  Infinity from an older runtime) left out of it and only that entry; the ``InstanceStatus``
  routing reads; and what the document says of the server beyond it (its models, those
  draining, their windows, its hardware, weight budget and quantum), learned at every read,
  since a placement controller may add or remove models while the runtime runs
  (runtime/placement_routes.py);
- a placement change's answer (``placement_answer``): its JSON object, whose models are learned
  too, or ``PlacementRefused`` with the server's error when it did not take the change.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

import msgspec

from talaria.core.protocol import ProtocolError
from talaria.core.protocol_events import ErrorEvent, event_from_dict
from talaria.core.protocol_status import status_from_dict
from talaria.core.status import InstanceStatus, lenient_status
from talaria.core.types import CallRejected, GenerationEvent
from talaria.proxy.runtimes.base import RuntimeUnavailable

log = logging.getLogger("talaria.proxy.runtimes.http")


class PlacementRefused(RuntimeError):
    """The runtime did not take a placement change: ``status`` is its HTTP answer (0: it
    could not be reached), the message its error."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def decode_event(data: dict[str, Any]) -> GenerationEvent:
    """A generation event, or raise: ``CallRejected`` for the caller's fault,
    ``RuntimeUnavailable`` for the runtime's."""
    event = event_from_dict(data)
    if isinstance(event, ErrorEvent):
        if event.code is not None:
            raise CallRejected(event.code, event.message, event.param)
        raise RuntimeUnavailable(event.message)
    return event


async def ndjson_lines(chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The non-empty lines of an NDJSON stream that arrives in ``chunks`` of any size (a line
    may span many chunks: each byte is scanned once)."""
    buffer = bytearray()
    async for chunk in chunks:
        start = len(buffer)
        buffer += chunk
        cut = buffer.rfind(b"\n", start)
        if cut < 0:
            continue
        for line in bytes(buffer[:cut]).split(b"\n"):
            if line.strip():
                yield line
        del buffer[: cut + 1]
    if buffer.strip():
        yield bytes(buffer)


class StatusReader:
    """One runtime server's status documents, read (module docstring); ``name()`` is the
    runtime's name, for its errors and log lines."""

    def __init__(self, name: Callable[[], str]) -> None:
        self._name = name
        self.models: tuple[str, ...] = ()
        """The models the server hosts (empty before its first status)."""
        self.windows: dict[str, int] = {}
        """Each model's context window (its engine's ``max_model_len``)."""
        self.draining: frozenset[str] = frozenset()
        """The models the last status listed as draining."""
        self.weight_budget_bytes = float("inf")
        """The pinned weights the node may hold (a placement's budget)."""
        self.quantum_s: float | None = None
        """The node's slot quantum."""
        self.server: str | None = None
        """The node's hardware, a catalog server."""
        self.gpus: int | None = None
        """The GPUs of the node's group."""
        self._left_out: frozenset[str] = frozenset()

    def parse(self, raw: bytes) -> tuple[dict[str, Any], list[str]]:
        """The status document's JSON, and the entries left out of it (module docstring)."""
        dropped: list[str] = []
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:  # NaN or Infinity in an entry: only that entry goes
            try:
                data, dropped = lenient_status(raw)
            except ValueError:
                raise RuntimeUnavailable(f"runtime {self._name()} status: {exc}") from exc
        if not isinstance(data, dict):
            raise RuntimeUnavailable(f"runtime {self._name()} status: not a JSON object")
        return data, dropped

    def read(self, data: dict[str, Any], dropped: list[str]) -> InstanceStatus:
        """Learn what the document says (:meth:`learn`); its status, less the entries that do
        not decode (a bad model's costs only that model, never the runtime); what is left out
        is logged when it changes."""
        self.learn(data)
        try:
            status = status_from_dict(data, dropped)
        except ProtocolError as exc:
            raise RuntimeUnavailable(f"runtime {self._name()} status: {exc}") from exc
        if frozenset(dropped) != self._left_out:
            self._left_out = frozenset(dropped)
            if dropped:
                log.error("runtime %s: status %s left out: bad entries", self._name(), dropped)
        return status

    def learn(self, data: Mapping[str, Any]) -> None:
        """The models (and their windows) a status document lists, or a placement answer: a
        placement controller may add or remove models while the runtime runs
        (runtime/placement_routes.py), and every status read picks the change up."""
        names = data.get("model_names")
        if isinstance(names, list):
            self.models = tuple(str(n) for n in names)
        draining = data.get("draining_models")
        if isinstance(draining, list):
            self.draining = frozenset(str(n) for n in draining)
        server, gpus = data.get("server"), data.get("gpus")
        if isinstance(server, str) and isinstance(gpus, int):
            self.server, self.gpus = server, gpus
        budget, quantum = data.get("weight_budget_bytes"), data.get("quantum_s")
        if isinstance(budget, int | float):
            self.weight_budget_bytes = float(budget)
        if isinstance(quantum, int | float):
            self.quantum_s = float(quantum)
        engines = data.get("engines")
        if isinstance(engines, dict):
            self.windows = {
                m: int(info["max_model_len"])
                for m, info in engines.items()
                if isinstance(info, dict) and isinstance(info.get("max_model_len"), int)
            }


def placement_answer(raw: bytes, status: int, request: str) -> dict[str, Any]:
    """The JSON object a placement change was answered with (empty if it sent none), or
    ``PlacementRefused`` with the server's error (``request`` names the change in the
    message: ``runtime <name>: <method> <path>``)."""
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if status >= 300:
        error = data.get("error") or raw[:200].decode(errors="replace")
        raise PlacementRefused(f"{request}: {error}", status)
    return data
