"""The NDJSON line splitter of the runtime hop (proxy/runtimes/decoding.py): whatever the
chunks, the lines come out whole, in order, blank ones dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from talaria.proxy.runtimes.decoding import ndjson_lines

LINE = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"x"))


async def _chunks(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    last = 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        yield data[last:cut]
        last = cut
    yield data[last:]


@given(st.lists(LINE, max_size=20), st.lists(st.integers(0, 7000), max_size=30), st.booleans())
def test_lines_survive_any_chunking(lines: list[bytes], cuts: list[int], final: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if final else b"")

    async def collect() -> list[bytes]:
        return [line async for line in ndjson_lines(_chunks(data, cuts))]

    assert asyncio.run(collect()) == [line for line in lines if line.strip()]
