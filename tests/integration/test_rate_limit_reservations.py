"""Token limits before the work, through the real HTTP stack: the proxy on a loopback port
(uvicorn), the embedded simulated runtime, a real SQLite file, a fixed wall clock, and the
real ``openai`` client streaming. A rate-limited call reserves its prompt + output limit
against its key's minute as it is admitted and settles to what the engine processed when it
ends, cancelled included (proxy/callpath/limits.py). With ``--tpm 20000``: 20 concurrent
~8,000-token calls admit 2 on one replica, 4 on two (≤ 3 + one per replica; before, all 20:
tokens were counted only as calls ended); 20 streams closed early are charged, and the next
call is limited (before, a cancelled stream was charged nothing: never limited)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from openai import AsyncStream
from openai.types.chat import ChatCompletionChunk

from talaria.core.calls import Call
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from tests.integration.server import running_app
from tests.integration.test_rate_limits import T0, _make_keys

MODEL = "glm-4.5-fp8"
TPM = 20_000
OUTPUT_LIMIT = 3_000
PROMPT_WORDS = 4_000  # "word " × 4,000: ~5,000 tokens (the proxy's estimate: UTF-8 bytes / 4)
TIME_SCALE = 5.0
"""The simulated node 5× real time: a 3,000-token reply streams for seconds, so a stream the
test closes after its first delta is still running, and a burst's calls overlap."""
KEYS = {name: (name, None, TPM) for name in ("burst", "cancel", "refused")}


def _messages(n: int) -> list[dict[str, str]]:
    """A ~5,000-token prompt of its own (every call its own session)."""
    return [{"role": "user", "content": f"task {n:04d}: " + "word " * PROMPT_WORDS}]


def _prompt_tokens() -> int:
    return Call(MODEL, messages=tuple(_messages(0))).prompt_tokens()


RESERVATION = _prompt_tokens() + OUTPUT_LIMIT
"""What each call reserves: ~8,000 tokens, two of which fit 20,000."""


@dataclass
class Proxies:
    urls: list[str]
    keys: dict[str, str]


def _app(url: str) -> object:
    settings = ProxySettings(
        database_url=url, time_scale=TIME_SCALE, models=[MODEL], rate_sync_s=86_400.0
    )  # syncs at start and at the drain only: a replica knows only its own counts meanwhile
    return create_app(settings, wall_clock=lambda: T0 + 15.25)


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxies]:
    """Two replicas on one database (the second only for the burst across replicas)."""
    url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('reserve') / 'r.db'}"
    more = {"replicas": ("replicas", None, TPM)}
    keys = asyncio.run(_make_keys(url, {**KEYS, **more}))
    with running_app(_app(url)) as first, running_app(_app(url)) as second:
        yield Proxies([first, second], keys)


def _client(proxies: Proxies, key: str, replica: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=proxies.urls[replica] + "/v1", api_key=proxies.keys[key], max_retries=0
    )


async def _open(client: openai.AsyncOpenAI, n: int) -> AsyncStream[ChatCompletionChunk] | None:
    """Open a ~8,000-token stream that would run to its output limit (seconds); None: refused
    (429, for the key's tokens)."""
    try:
        return await client.chat.completions.create(
            model=MODEL,
            messages=_messages(n),  # type: ignore[arg-type]
            max_tokens=OUTPUT_LIMIT,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    except openai.RateLimitError as refused:
        _refused_for_tokens(refused)
        return None


async def _stream(client: openai.AsyncOpenAI, n: int, deltas: int) -> bool:
    """:func:`_open` a stream, read ``deltas`` content deltas, then close it long before its
    end (the client goes away: the call is abandoned). False: refused."""
    stream = await _open(client, n)
    if stream is None:
        return False
    try:
        seen = 0
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                seen += 1
            if seen >= deltas:
                break
    finally:
        await stream.close()
    return True


async def _burst(clients: list[openai.AsyncOpenAI]) -> int:
    """20 streams at once, through the clients in turn, all held open until every one is
    answered (concurrent calls), then closed; how many were admitted."""
    opened = await asyncio.gather(*(_open(clients[n % len(clients)], n) for n in range(20)))
    admitted = [stream for stream in opened if stream is not None]
    for stream in admitted:
        await stream.close()
    return len(admitted)


def _refused_for_tokens(refused: openai.RateLimitError) -> int:
    """A 429 for the key's tokens in OpenAI's envelope, with Retry-After; the tokens it says
    are left of the minute."""
    assert refused.response.headers["retry-after"] == "45"
    error = refused.body  # the envelope's "error"
    assert isinstance(error, dict), refused.body
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "rate_limit_error"
    message = str(error["message"])
    assert f"{TPM} tokens per minute" in message
    assert f"reserves {RESERVATION} tokens" in message
    left = re.search(r"(\d+) are left this minute", message)
    assert left is not None, message
    return int(left.group(1))


def test_a_burst_of_20_calls_of_8k_tokens_admits_what_fits_20k(proxies: Proxies) -> None:
    """All at once, on one replica: 2 (⌊20,000 / ~8,000⌋; ≤ 3 + 1); the rest get 429."""

    async def main() -> int:
        async with _client(proxies, "burst") as client:
            return await _burst([client])

    assert 2 * RESERVATION <= TPM < 3 * RESERVATION
    assert asyncio.run(main()) == 2 <= 3 + 1


def test_a_burst_across_two_replicas_admits_one_share_more_per_replica(proxies: Proxies) -> None:
    """Half the burst through each of two replicas that have not synced: each admits what
    fits the limit on its own counts, 2 + 2 ≤ 3 + 2 (proxy/callpath/limits.py, "Bound")."""

    async def main() -> int:
        clients = [_client(proxies, "replicas", r) for r in range(2)]
        try:
            return await _burst(clients)
        finally:
            for client in clients:
                await client.close()

    assert asyncio.run(main()) == 4 <= 3 + 2


def test_streams_closed_early_are_charged_and_the_next_call_is_limited(proxies: Proxies) -> None:
    """20 streams one after another, each closed after its first delta: each charged its
    prompt and the output it had, not nothing; so after 3 the key's minute cannot hold
    another's reservation, and the next call gets 429 too. What is left of the minute shows
    the charge: at least the 3 prompts, less than the 3 reservations (the output not produced
    was given back)."""

    async def main() -> tuple[list[bool], int]:
        async with _client(proxies, "cancel") as client:
            admitted = [await _stream(client, 100 + n, 1) for n in range(20)]
            try:
                await client.chat.completions.create(
                    model=MODEL,
                    messages=_messages(200),  # type: ignore[arg-type]
                    max_tokens=OUTPUT_LIMIT,
                )
            except openai.RateLimitError as refused:
                return admitted, _refused_for_tokens(refused)
            raise AssertionError("the next call was served")

    admitted, left = asyncio.run(main())
    assert admitted[:2] == [True, True] and sum(admitted) == 3, admitted
    charged = TPM - left
    assert 3 * _prompt_tokens() < charged < 3 * RESERVATION


def test_a_call_refused_before_it_runs_gives_its_reservation_back(proxies: Proxies) -> None:
    """A call whose output limit does not fit the model's window (400, before it runs)
    reserved the whole minute (its estimate capped at the limit) and gives it back: two
    ~8,000-token calls are served after it."""

    async def main() -> list[bool]:
        async with _client(proxies, "refused") as client:
            for _ in range(2):
                with pytest.raises(openai.BadRequestError, match="maximum context length"):
                    await client.chat.completions.create(
                        model=MODEL,
                        messages=_messages(300),  # type: ignore[arg-type]
                        max_tokens=10_000_000,
                    )
            return [await _stream(client, 300 + n, 1) for n in range(2)]

    assert asyncio.run(main()) == [True, True]
