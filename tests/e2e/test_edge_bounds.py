"""Slow and vanishing clients against ``talaria serve`` as a real process with 256 file
descriptors (core/http_edge.py, core/body_deadline.py; docs/operations.md, "Bounds, quotas and
timeouts"). Loopback only; every loop is bounded in count and time.

- *Slowloris*: connections that send their request line and headers a byte at a time are
  closed ``TALARIA_HEADER_TIMEOUT_S`` after they opened, while a normal call is served.
  Past the connection bound (half the descriptor limit: 128), new connections get an
  immediate 503 instead of waiting in the kernel's backlog for a descriptor, and the server
  never runs out of descriptors.
- A body sent a byte at a time gets 408 in the API's envelope after ``TALARIA_BODY_TIMEOUT_S``,
  read whole even by a client that is still sending (the server half-closes and lingers).
- A client that disconnects mid-body leaves one warning line and a 499 in
  ``talaria_requests_total``, not a traceback and a 500.
- ``talaria runtime`` closes slow request heads too, at the default timeout.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from bench.harness.processes import ServeProcess, talaria_runtime, talaria_serve
from talaria.core.http_edge import HEADER_TIMEOUT_S
from tests.support import chat_requests

MODEL = "glm-4.5-fp8"
DESCRIPTORS = 256
BOUND = DESCRIPTORS // 2
UNDER = BOUND - 8
"""Slow connections in the run under the bound (the normal calls need a few)."""
HEADER_S = 5.0
"""The server's header timeout here. Refusals past the connection bound must come before it
(``quick_s``: HEADER_S − 0.5 s); a loaded box finishes a burst's handshakes at the kernel's
SYN-ACK resends, 1 s and 3 s after the first, so 3 s (the value before) left 0.5 s."""
BODY_S = 2.0
TRICKLE_S = 0.25
"""A slow client sends one byte this often."""
SLACK_S = 3.0
"""How much later than its deadline a connection may be closed on this loaded 2-core box."""
HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    b"content-type: application/json\r\nx-slow: "
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    env = {"TALARIA_HEADER_TIMEOUT_S": str(HEADER_S), "TALARIA_BODY_TIMEOUT_S": str(BODY_S)}
    args = ["--models", MODEL, "--time-scale", "100"]
    data = tmp_path_factory.mktemp("edge")
    with talaria_serve(args, env, data, max_descriptors=DESCRIPTORS) as process:
        yield process


@dataclass
class Slow:
    """One slowloris connection: how long until the server closed it, and what it sent."""

    lasted_s: float | None
    """None: still open at the end of the run."""
    answer: bytes
    opened_s: float = 0.0
    """When it was opened (the client's loop time)."""

    @property
    def closed_s(self) -> float | None:
        """When the server closed it (the client's loop time), if it did."""
        return None if self.lasted_s is None else self.opened_s + self.lasted_s


async def _slowloris(port: int, count: int, started: asyncio.Event, run_s: float) -> list[Slow]:
    """``count`` connections, each sending HEAD (then header bytes) one byte per TRICKLE_S
    for at most ``run_s``; ``started`` is set once every one has sent two bytes or ended. A
    connection that gets an answer closes at once (as a client reading ``Connection: close``
    does)."""
    loop = asyncio.get_running_loop()
    waiting = count

    async def one() -> Slow:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Nagle on (asyncio turns it off): the flood overflows the server's small listen
        # backlog, so the kernel completes handshakes with SYN cookies, which take the
        # client's first sequence number from whichever segment completes the handshake;
        # without Nagle a later one-byte segment can arrive first and the bytes before it
        # are lost (the server then answers 400). With it, a byte is sent only once the one
        # before it was acknowledged, so the first to arrive is the first sent.
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        opened = loop.time()
        marked = False

        def mark() -> None:
            nonlocal waiting, marked
            if not marked:
                marked, waiting = True, waiting - 1
                if waiting == 0:
                    started.set()

        async def trickle() -> None:
            for i in range(int(run_s / TRICKLE_S)):
                writer.write(HEAD[i : i + 1] or b"a")
                try:
                    await writer.drain()
                except ConnectionError:
                    return
                if i == 1:
                    mark()
                await asyncio.sleep(TRICKLE_S)

        trickler = asyncio.create_task(trickle())
        answer = b""
        lasted: float | None = None
        try:
            async with asyncio.timeout(run_s):
                answer = await reader.read(4096)
                lasted = loop.time() - opened
        except ConnectionError:
            lasted = loop.time() - opened
        except TimeoutError:
            pass
        finally:
            trickler.cancel()
            writer.close()
            mark()
        return Slow(lasted, answer, opened)

    return await asyncio.gather(*(one() for _ in range(count)))


def _chat() -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def _flood(
    served: ServeProcess, count: int
) -> tuple[list[Slow], httpx.Response | str, float]:
    """``count`` slow connections, and a normal call once they all are sending: the slow
    connections' fates, the call's response (or the name of the error it raised) and its
    latency (s)."""
    port = urlsplit(served.base_url).port
    assert port is not None
    started = asyncio.Event()
    waves = count // BOUND + 1  # a loaded server may accept a burst past its backlog in waves
    run_s = waves * HEADER_S + SLACK_S + 5
    flood = asyncio.create_task(_slowloris(port, count, started, run_s))
    async with asyncio.timeout(HEADER_S):
        await started.wait()
    async with httpx.AsyncClient(timeout=30) as client:
        t0 = time.monotonic()
        response: httpx.Response | str
        try:
            response = await client.post(served.v1 + "/chat/completions", json=_chat())
        except httpx.ReadError as exc:
            response = type(exc).__name__
        latency = time.monotonic() - t0
    return await flood, response, latency


def _normal_call(served: ServeProcess) -> httpx.Response:
    return httpx.post(served.v1 + "/chat/completions", json=_chat(), timeout=30)


def test_slowloris_under_the_bound_is_closed_after_the_header_timeout(
    served: ServeProcess,
) -> None:
    slow, response, latency = asyncio.run(_flood(served, UNDER))
    assert isinstance(response, httpx.Response), response
    assert response.status_code == 200, response.text
    assert latency < HEADER_S, latency  # served meanwhile, not after the slow ones went
    lasted = sorted(s.lasted_s for s in slow if s.lasted_s is not None)
    assert len(lasted) == UNDER and all(s.answer == b"" for s in slow)
    assert HEADER_S - 0.5 <= lasted[0] <= lasted[-1] <= HEADER_S + SLACK_S, lasted
    print(f"\n{UNDER} slow: closed after {lasted[0]:.2f}-{lasted[-1]:.2f} s; call {latency:.3f} s")
    assert _normal_call(served).status_code == 200


def _most_held_at_once(held: list[Slow]) -> int:
    """How many of ``held`` the server held at once: each was held for the header timeout
    before it closed it, so over [closed − HEADER_S, closed] (the client cannot see when the
    server accepted it: a loaded server accepts a burst past its backlog in waves)."""
    edges = sorted(
        (t, step)
        for s in held
        if (closed := s.closed_s) is not None
        for t, step in ((closed - HEADER_S + 0.25, 1), (closed, -1))
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_slowloris_past_the_descriptor_limit_gets_quick_503s(served: ServeProcess) -> None:
    """Past the descriptor limit, connections are refused at once (a 503 in the envelope, or,
    past the linger budget, closed without a word: core/connection_gate.py) and the server
    never holds more than BOUND. A loaded server accepts the burst past its listen backlog in
    waves (each as held connections time out), and the kernel's SYN cookies may garble a late
    one's first bytes (a 400): both are allowed, what is held is counted at once."""
    count = DESCRIPTORS + 44
    slow, response, latency = asyncio.run(_flood(served, count))
    assert all(s.lasted_s is not None for s in slow)  # the server ended every one
    answered = [s for s in slow if s.answer.startswith(b"HTTP/1.1 503")]
    quick_s = HEADER_S - 0.5  # before any held connection's descriptor frees (HEADER_S)
    silent = [s for s in slow if s.answer == b"" and (s.lasted_s or 0.0) < quick_s]
    held = [s for s in slow if s.answer == b"" and s not in silent]
    garbled = [s for s in slow if s.answer.startswith(b"HTTP/1.1 400")]
    assert len(answered) + len(silent) + len(held) + len(garbled) == count
    assert _most_held_at_once(held) <= BOUND
    assert answered, "no refusal said 503"
    head, _, body = answered[0].answer.partition(b"\r\n\r\n")
    assert b"retry-after: 1" in head and b"connection: close" in head
    assert json.loads(body)["error"]["code"] == "too_many_connections"
    # quick: before any held connection's descriptor frees (HEADER_S). Not tighter: a burst
    # past the accept backlog has its handshakes finished by the kernel's SYN-ACK resend, 1 s
    # later, so a loaded box sees refusals at 1-2 s
    refused_s = min(s.lasted_s or 0.0 for s in answered)
    assert refused_s < quick_s, refused_s
    held_s = sorted(s.lasted_s or 0.0 for s in held)
    assert held and held_s[0] >= HEADER_S - 0.5, held_s  # held until the header timeout
    # the call made meanwhile: a 200, a 503 in the envelope while the bound is full, or a
    # reset when the flood's refusals have used the linger budget (core/connection_gate.py:
    # past it a refused connection is closed at once, and a client still sending is reset)
    status = response if isinstance(response, str) else response.status_code
    assert status in (200, 503, "ReadError") and latency < quick_s, (status, latency)
    print(
        f"\n{count} slow: {len(answered)} refused with a 503 (first after {refused_s:.2f} s), "
        f"{len(silent)} closed at once, {len(held)} held ({_most_held_at_once(held)} at once, "
        f"closed after {held_s[0]:.2f}-{held_s[-1]:.2f} s), {len(garbled)} garbled; call "
        f"meanwhile {status} in {latency:.3f} s"
    )
    t0 = time.monotonic()
    assert _normal_call(served).status_code == 200
    print(f"call after: 200 in {time.monotonic() - t0:.3f} s")
    assert not [line for line in served.output if "out of system resource" in line]


async def _kept_alive_then_slow(port: int) -> tuple[bytes, float]:
    """One call on a connection, then the next request's head a byte per TRICKLE_S: the
    first response, and how long after it the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    first = await reader.readuntil(b"}")  # the whole JSON body: {"ok":true,...}
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(HEADER_S + SLACK_S):
            for byte in HEAD:
                writer.write(bytes([byte]))
                await writer.drain()
                if await _closed_within(reader, TRICKLE_S):
                    break
    except ConnectionError:
        pass
    finally:
        writer.close()
    return first, time.monotonic() - t0


async def _closed_within(reader: asyncio.StreamReader, wait_s: float) -> bool:
    try:
        async with asyncio.timeout(wait_s):
            return await reader.read(1) == b""
    except TimeoutError:
        return False


def test_a_kept_alive_connection_gets_the_header_timeout_after_its_response(
    served: ServeProcess,
) -> None:
    """uvicorn's keep-alive timer stops at the first byte of the next request; the header
    deadline, counted from the previous response, still closes it."""
    port = urlsplit(served.base_url).port
    assert port is not None
    first, closed_after = asyncio.run(_kept_alive_then_slow(port))
    assert first.startswith(b"HTTP/1.1 200")
    assert HEADER_S - 0.5 <= closed_after <= HEADER_S + SLACK_S, closed_after


async def _slow_body(port: int, path: str) -> tuple[bytes, float]:
    """A request whose head arrives whole and whose 64-byte body comes a byte per TRICKLE_S:
    what the server answers (read until it closes) and when."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        "content-length: 64\r\n\r\n"
    ).encode()
    writer.write(head + b"{")
    t0 = time.monotonic()

    async def trickle() -> None:
        for _ in range(63):
            await asyncio.sleep(TRICKLE_S)
            writer.write(b" ")
            try:
                await writer.drain()
            except ConnectionError:
                return

    trickler = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(BODY_S + SLACK_S):
            answer = await reader.read()  # to EOF: the server closes after its 408
    finally:
        trickler.cancel()
        writer.close()
    return answer, time.monotonic() - t0


@pytest.mark.parametrize(
    ("path", "envelope"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")],
)
def test_a_slow_body_gets_408_in_the_apis_envelope(
    served: ServeProcess, path: str, envelope: str
) -> None:
    port = urlsplit(served.base_url).port
    assert port is not None
    answer, took = asyncio.run(_slow_body(port, path))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in head.lower()
    assert BODY_S - 0.5 <= took <= BODY_S + SLACK_S, took
    doc = json.loads(body)
    if envelope == "openai":
        assert doc["error"]["code"] == "request_timeout"
    else:
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    assert "did not arrive within 2 s" in body.decode()


async def _busy_body(port: int, gap_s: float) -> bytes | str:
    """A request whose 1 MB body comes a byte per ``gap_s``, never finishing: what the
    server answers (read until it closes), or the name of the error the read raised."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: 1000000\r\n\r\n{"
    )

    async def trickle() -> None:
        while True:
            await asyncio.sleep(gap_s)
            writer.write(b" ")
            try:
                await writer.drain()
            except ConnectionError:
                return

    trickler = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(BODY_S + SLACK_S):
            return await reader.read()
    except ConnectionError as exc:
        return type(exc).__name__
    finally:
        trickler.cancel()
        writer.close()


async def _busy_bodies(port: int) -> list[bytes | str]:
    gaps = (0.002, 0.005, 0.01, 0.02, 0.05) * 5
    return await asyncio.gather(*(_busy_body(port, gap) for gap in gaps))


def test_a_client_still_sending_reads_the_whole_408(served: ServeProcess) -> None:
    """The 408 closes a connection whose client is still sending its body: the server
    half-closes and drops the rest (core/http_edge.py, lingering close), so the client reads
    the answer, not a reset (closed at once, about half of such connections read ECONNRESET
    here, and this test failed 4 runs in 4)."""
    port = urlsplit(served.base_url).port
    assert port is not None
    answers = asyncio.run(_busy_bodies(port))
    for answer in answers:
        assert isinstance(answer, bytes), answer
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert answer.endswith(b"}"), answer  # the whole JSON envelope


async def _leave_mid_body(port: int) -> None:
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n" + b'{"model": '
    )
    await writer.drain()
    writer.close()
    await writer.wait_closed()


def test_a_client_leaving_mid_body_is_one_log_line_and_no_500(served: ServeProcess) -> None:
    port = urlsplit(served.base_url).port
    assert port is not None

    def counted(status: str) -> float:
        return chat_requests(served.base_url).get(status, 0.0)

    before = counted("499")
    lines_before = len(served.output)
    asyncio.run(_leave_mid_body(port))
    deadline = time.monotonic() + 10
    while counted("499") == before or not _gone(served, lines_before):
        assert time.monotonic() < deadline, "the disconnect was never counted or logged"
    assert counted("500") == 0
    new = served.output[lines_before:]
    assert len(_gone(served, lines_before)) == 1, new
    assert not [line for line in new if "Traceback" in line or "ERROR" in line], new


def _gone(served: ServeProcess, since: int) -> list[str]:
    return [line for line in served.output[since:] if "client went away" in line]


RUNTIME_TOML = """
[node]
name = "edge"
policy = "talaria"
time_scale = 100

[[model]]
name = "glm-4.5-fp8"
engine = "sim"
"""


def test_the_runtime_server_closes_slow_heads_at_its_default_timeout(tmp_path: Path) -> None:
    """``talaria runtime`` runs the same edge with the defaults (core/http_edge.py)."""
    config = tmp_path / "node.toml"
    config.write_text(RUNTIME_TOML)

    async def run(base_url: str) -> tuple[list[Slow], int]:
        port = urlsplit(base_url).port
        assert port is not None
        started = asyncio.Event()
        flood = asyncio.create_task(_slowloris(port, 20, started, HEADER_TIMEOUT_S + SLACK_S + 5))
        async with asyncio.timeout(HEADER_TIMEOUT_S):
            await started.wait()
        async with httpx.AsyncClient(timeout=10) as client:
            status = (await client.get(base_url + "/v1/runtime/status")).status_code
        return await flood, status

    with talaria_runtime(config) as runtime:
        slow, status = asyncio.run(run(runtime.base_url))
    assert status == 200
    lasted = sorted(s.lasted_s for s in slow if s.lasted_s is not None)
    assert len(lasted) == 20, slow
    assert HEADER_TIMEOUT_S - 0.5 <= lasted[0] <= lasted[-1] <= HEADER_TIMEOUT_S + SLACK_S
