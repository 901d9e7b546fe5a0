"""Session-wide setup for every test: under pytest-xdist (scripts/test.sh runs the main stage
with ``-n``), each worker gets its own PostgreSQL database.

The tests that use PostgreSQL (tests/store/conftest.py ``db_url`` and the integration tests
that call ``tests.support.pg_url``) empty the ``public`` schema of the database
``TALARIA_TEST_PG_URL`` names before each test. Two workers on one database would empty it
under each other, so each worker creates ``<database>_<worker id>`` on the same server
(dropped first if a crashed run left it) and points ``TALARIA_TEST_PG_URL`` at it, for itself
and the processes it starts. Without xdist, or without the variable, nothing changes.

The tests read the CLI's errors from rich's panels, which wrap at the terminal's width (80
columns when there is none): a long temporary path (xdist's are longer) split a file name
across two lines. Typer's ``TERMINAL_WIDTH`` (read when typer's rich module is imported, after
this) is set wide for every test and the processes it starts; pytest's own lines keep theirs.

The test files listed in tests/slow_files.txt are collected first, longest first, the others
after them in their own order: scripts/test.sh runs each stage on two workers a file at a time
(``--dist loadfile --no-loadscope-reorder``), and handing out the longest files first keeps
one worker from starting a long file while the other has nothing left (longest processing
time first; the vLLM stage measured 645 s in its directory order, ~540 s so ordered).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support import PG_ENV


def worker_database_url(url: str, worker: str) -> tuple[str, str]:
    """``(url of the worker's database, its name)``: ``url`` with its database ``db`` named
    ``db_<worker>`` (``postgresql+asyncpg://u@h:p/db`` → ``…/db_gw0``)."""
    base, _, database = url.rpartition("/")
    name = f"{database.split('?')[0]}_{worker}"
    return f"{base}/{name}", name


async def _create_database(url: str, name: str) -> None:
    import asyncpg  # the driver the store uses (talaria[proxy])

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


SLOW_FILES = Path(__file__).with_name("slow_files.txt")


def slow_files(text: str) -> list[str]:
    """The test files listed in ``text`` (tests/slow_files.txt): one path from the repository
    root per line, longest first; ``#`` starts a comment."""
    return [p for line in text.splitlines() if (p := line.split("#", 1)[0].strip())]


def slowest_first(paths: list[str], slow: list[str]) -> list[int]:
    """The order (indices into ``paths``, one per collected test, its file's path) that puts
    the tests of the files in ``slow`` first, in ``slow``'s order, and keeps the others in
    theirs after them; a file's tests stay together and in order."""
    rank = {path: i for i, path in enumerate(slow)}
    return sorted(range(len(paths)), key=lambda i: (rank.get(paths[i], len(slow)), i))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    paths = [item.path.relative_to(root).as_posix() for item in items]
    order = slowest_first(paths, slow_files(SLOW_FILES.read_text()))
    items[:] = [items[i] for i in order]


WIDE_TERMINAL = "1000"
"""Columns for rich's output in tests: no message the tests read is that long."""


def pytest_configure(config: pytest.Config) -> None:
    os.environ["TERMINAL_WIDTH"] = WIDE_TERMINAL
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    url = os.environ.get(PG_ENV)
    if not worker or not url:
        return
    worker_url, name = worker_database_url(url, worker)
    asyncio.run(_create_database(url, name))
    os.environ[PG_ENV] = worker_url
