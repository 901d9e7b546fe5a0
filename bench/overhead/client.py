"""The load client of ``bench/proxy_overhead.py``: a lean HTTP/1.1 keep-alive client on asyncio
streams (one connection per concurrent worker), so the client spends little CPU per request and
the servers' costs dominate.

A request is pre-encoded bytes; a reply is read whole (``content-length`` or chunked), its
latency timed from the first byte written to the last byte read. Each API's judge and full check
of a reply are in apis.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class HttpError(Exception):
    pass


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 22
        )
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
            self._writer = self._reader = None

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            await self.open()
        assert self._reader is not None and self._writer is not None
        reader = self._reader
        self._writer.write(data)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"\r\ncontent-length:")
        if at >= 0:
            end = lower.index(b"\r\n", at + 2)
            body = await reader.readexactly(int(lower[at + 17 : end]))
        elif b"\r\ntransfer-encoding: chunked" in lower:
            parts = []
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")  # no trailers
                    break
                parts.append((await reader.readexactly(size + 2))[:-2])
            body = b"".join(parts)
        else:
            body = await reader.read()
            await self.close()
            return status, body
        if b"\r\nconnection: close" in lower:
            await self.close()
        return status, body


def encode_post(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 POST request (keep-alive)."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class BatchResult:
    latencies_s: list[float]
    wall_s: float
    client_cpu_s: float
    errors: int
    first_error: str | None
    bodies: list[tuple[int, bytes]] = field(default_factory=list)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_batch(
    host: str,
    port: int,
    requests: Sequence[bytes],
    concurrency: int,
    judge: Callable[[int, bytes], str | None],
    keep_bodies: bool = False,
) -> BatchResult:
    """Send ``requests`` (whole, pre-encoded) with ``concurrency`` workers, one connection each,
    opened before the clock starts."""
    conns = [Connection(host, port) for _ in range(concurrency)]
    await asyncio.gather(*(c.open() for c in conns))
    latencies = [0.0] * len(requests)
    errors = 0
    first_error: str | None = None
    bodies: list[tuple[int, bytes]] = []
    next_index = 0
    perf = time.perf_counter

    async def worker(conn: Connection) -> None:
        nonlocal next_index, errors, first_error
        while next_index < len(requests):
            i = next_index
            next_index += 1
            t0 = perf()
            try:
                status, reply = await conn.request(requests[i])
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                await conn.close()
                status, reply = 599, repr(exc).encode()
            latencies[i] = perf() - t0
            problem = judge(status, reply)
            if problem is not None:
                errors += 1
                first_error = first_error or problem
            if keep_bodies:
                bodies.append((status, reply))

    cpu0, t0 = _cpu_s(), perf()
    await asyncio.gather(*(worker(c) for c in conns))
    wall, cpu = perf() - t0, _cpu_s() - cpu0
    await asyncio.gather(*(c.close() for c in conns))
    return BatchResult(latencies, wall, cpu, errors, first_error, bodies)
