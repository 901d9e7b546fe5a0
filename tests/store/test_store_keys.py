"""API keys in the store, on both backends: deleting (a tombstone), tenant names in listings, a
restart after revoking or deleting every key, the ``talaria keys`` commands (a key's priority,
weight and rate limits among them); and the SQLite file's mode."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from talaria.cli.keys import keys_app
from talaria.core.types import Priority
from talaria.proxy.callpath.auth import Authenticator
from talaria.proxy.contract.calls import Caller, RateLimits, Share
from talaria.proxy.contract.errors import ApiError
from talaria.proxy.store.db import data_dir, make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore

runner = CliRunner()


async def _status(auth: Authenticator, key: str | None, host: str) -> int:
    """The status the caller gets: 200 if it is served, else the ``ApiError``'s."""
    try:
        await auth.tenant(f"Bearer {key}" if key else None, host)
    except ApiError as exc:
        return exc.status
    return 200


@pytest.mark.asyncio
async def test_delete_leaves_a_tombstone_that_still_counts(store: SqlStore) -> None:
    acme = await store.tenants.create_tenant("acme")
    key = await store.tenants.create_api_key(acme)
    other = await store.tenants.create_api_key(acme)
    info = (await store.tenants.list_api_keys())[0]
    assert await store.tenants.delete_api_key(info.id)
    assert not await store.tenants.delete_api_key(info.id)  # deleted already
    assert not await store.tenants.delete_api_key("no-such-key")
    assert not await store.tenants.revoke_api_key(info.id)  # deleting revoked it
    assert await store.tenants.tenant_for_key(key) is None
    assert await store.tenants.tenant_for_key(other) == acme
    assert await store.tenants.tenant_for_key(f"deleted:{info.id}") is None
    assert [i.prefix for i in await store.tenants.list_api_keys()] == [other[:8]]
    everything = await store.tenants.list_api_keys(include_deleted=True)
    assert [(i.id, i.deleted) for i in everything] == [(info.id, True), (everything[1].id, False)]
    assert everything[0].revoked_at is not None
    assert await store.tenants.count_api_keys() == 2
    assert await store.tenants.count_api_keys(active_only=True) == 1


@pytest.mark.asyncio
async def test_listed_keys_carry_their_tenant_name(store: SqlStore) -> None:
    acme = await store.tenants.create_tenant("acme")
    beta = await store.tenants.create_tenant("beta")
    await store.tenants.create_api_key(acme)
    await store.tenants.create_api_key(beta)
    infos = await store.tenants.list_api_keys()
    assert [(i.tenant_id, i.tenant_name) for i in infos] == [(acme, "acme"), (beta, "beta")]
    assert [i.tenant_name for i in await store.tenants.list_api_keys(beta)] == ["beta"]


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["revoke", "delete"])
async def test_a_restart_after_the_last_key_is_gone_stays_closed(store: SqlStore, how: str) -> None:
    key = await store.tenants.create_api_key(await store.tenants.create_tenant("acme"))
    running = Authenticator([], store.tenants)
    await running.start()
    assert await _status(running, key, "203.0.113.7") == 200
    key_id = (await store.tenants.list_api_keys())[0].id
    if how == "revoke":
        assert await store.tenants.revoke_api_key(key_id)
    else:
        assert await store.tenants.delete_api_key(key_id)
    restarted = Authenticator([], store.tenants)  # what a restart builds
    await restarted.start()
    assert not restarted.open
    for host in ("203.0.113.7", "127.0.0.1", "::1"):
        assert await _status(restarted, None, host) == 401
        assert await _status(restarted, "anything", host) == 401
        assert await _status(restarted, key, host) == 401
    # Only an explicit --allow-open serves again while no key is usable.
    reopened = Authenticator([], store.tenants, allow_open=True)
    await reopened.start()
    assert await _status(reopened, None, "203.0.113.7") == 200


# -- talaria keys ---------------------------------------------------------------------------


def _lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def _count(url: str, *, active_only: bool = False) -> int:
    async def main() -> int:
        engine = make_engine(url)
        try:
            return await SqlStore(make_sessionmaker(engine)).tenants.count_api_keys(
                active_only=active_only
            )
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _caller(url: str, key: str) -> Caller:
    async def main() -> Caller:
        engine = make_engine(url)
        try:
            caller = await SqlStore(make_sessionmaker(engine)).tenants.caller_for_key(key)
        finally:
            await engine.dispose()
        assert caller is not None
        return caller

    return asyncio.run(main())


def _tenant_for(url: str, key: str) -> str | None:
    async def main() -> str | None:
        engine = make_engine(url)
        try:
            return await SqlStore(make_sessionmaker(engine)).tenants.tenant_for_key(key)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def test_keys_commands_list_tenant_names_and_delete(db_url: str) -> None:
    created = runner.invoke(keys_app, ["create", "--tenant", "acme", "--url", db_url])
    assert created.exit_code == 0, created.output
    key = created.output.strip()
    assert _tenant_for(db_url, key) is not None
    listed = runner.invoke(keys_app, ["list", "--url", db_url])
    assert listed.exit_code == 0, listed.output
    [line] = _lines(listed.output)
    key_id = line.split()[0]
    assert "tenant=acme " in line and key[:8] in line and "deleted" not in line

    deleted = runner.invoke(keys_app, ["delete", key_id, "--url", db_url])
    assert deleted.exit_code == 0, deleted.output
    assert _lines(deleted.output) == [f"deleted {key_id}"]
    assert _lines(runner.invoke(keys_app, ["list", "--url", db_url]).output) == []
    [shown] = _lines(runner.invoke(keys_app, ["list", "--all", "--url", db_url]).output)
    assert shown.startswith(key_id) and shown.endswith("deleted") and "tenant=acme" in shown
    assert _tenant_for(db_url, key) is None
    assert _count(db_url) == 1 and _count(db_url, active_only=True) == 0

    for command in ("delete", "revoke"):
        unknown = runner.invoke(keys_app, [command, "no-such-id", "--url", db_url])
        assert unknown.exit_code == 1, (command, unknown.output)
        assert len(_lines(unknown.output)) == 1 and "no-such-id" in unknown.output
    again = runner.invoke(keys_app, ["delete", key_id, "--url", db_url])
    assert again.exit_code == 1 and len(_lines(again.output)) == 1


def test_keys_create_refuses_a_bad_priority_or_weight_and_creates_nothing(db_url: str) -> None:
    for bad, named in (
        (["--weight", "0"], "--weight"),
        (["--weight", "-1"], "--weight"),
        (["--weight", "101"], "--weight"),
        (["--weight", "nan"], "--weight"),
        (["--weight", "inf"], "--weight"),
        (["--priority", "urgent"], "--priority"),
        (["--priority", "batch", "--weight", "100.5"], "--weight"),
        (["--max-priority", "urgent"], "--max-priority"),
        (["--max-priority", "batch"], "--max-priority"),  # below the key's own (standard)
        (["--max-priority", "standard", "--priority", "interactive"], "--max-priority"),
    ):
        refused = runner.invoke(keys_app, ["create", "--tenant", "acme", *bad, "--url", db_url])
        assert refused.exit_code == 2, (bad, refused.output)
        shown = " ".join(refused.output.replace("│", " ").split())
        assert f"Invalid value for '{named}'" in shown, (bad, shown)
        assert "tk-" not in refused.output
    assert _lines(runner.invoke(keys_app, ["list", "--all", "--url", db_url]).output) == []
    assert _count(db_url) == 0  # no key, no tombstone: nothing was created


def test_keys_create_stores_and_lists_a_priority_and_weight(db_url: str) -> None:
    options = ["--tenant", "bulk", "--priority", "Batch", "--weight", "2"]
    made = runner.invoke(keys_app, ["create", *options, "--url", db_url])
    assert made.exit_code == 0, made.output
    plain = runner.invoke(keys_app, ["create", "--tenant", "ide", "--url", db_url])
    assert plain.exit_code == 0, plain.output
    assert _caller(db_url, made.output.strip()).share == Share(Priority.BATCH, 2.0)
    assert _caller(db_url, plain.output.strip()).share == Share(Priority.STANDARD, 1.0)
    listed = _lines(runner.invoke(keys_app, ["list", "--url", db_url]).output)
    assert [(line.split()[1], line.split()[3], line.split()[4]) for line in listed] == [
        ("tenant=bulk", "priority=batch", "weight=2"),
        ("tenant=ide", "priority=standard", "weight=1"),
    ]


def test_keys_create_stores_and_lists_a_ceiling(db_url: str) -> None:
    """``--max-priority``: the highest class the key's calls may ask (any case); without it
    the key's own priority is its ceiling, listed as such."""
    made = {}
    for options in (
        ("--priority", "batch", "--max-priority", "Interactive"),
        ("--priority", "batch"),
        ("--max-priority", "standard"),
    ):
        created = runner.invoke(keys_app, ["create", *options, "--url", db_url])
        assert created.exit_code == 0, created.output
        made[options] = _caller(db_url, created.output.strip())
    granted = made[("--priority", "batch", "--max-priority", "Interactive")]
    assert (granted.share.priority, granted.max_priority) == (Priority.BATCH, Priority.INTERACTIVE)
    assert granted.ceiling is Priority.INTERACTIVE
    plain = made[("--priority", "batch")]
    assert (plain.max_priority, plain.ceiling) == (None, Priority.BATCH)
    same = made[("--max-priority", "standard")]
    assert (same.max_priority, same.ceiling) == (Priority.STANDARD, Priority.STANDARD)
    listed = _lines(runner.invoke(keys_app, ["list", "--url", db_url]).output)
    assert [(line.split()[3], line.split()[8]) for line in listed] == [
        ("priority=batch", "max_priority=interactive"),
        ("priority=batch", "max_priority=batch"),
        ("priority=standard", "max_priority=standard"),
    ]


@pytest.mark.asyncio
async def test_a_keys_ceiling_reaches_its_caller_and_a_bad_one_is_refused(
    store: SqlStore, engine: AsyncEngine
) -> None:
    """The store keeps the ceiling; a class it does not know, or one below the key's own
    (written by hand, or by a later version), reads as none: never a higher class."""
    acme = await store.tenants.create_tenant("acme")
    key = await store.tenants.create_api_key(acme, priority="batch", max_priority="standard")
    caller = await store.tenants.caller_for_key(key)
    assert caller == Caller(acme, Share(Priority.BATCH), max_priority=Priority.STANDARD)
    for priority, ceiling in (("standard", "batch"), ("interactive", "standard"), ("batch", "x")):
        with pytest.raises(ValueError):
            await store.tenants.create_api_key(acme, priority=priority, max_priority=ceiling)
    [info] = await store.tenants.list_api_keys()
    assert (info.priority, info.max_priority) == ("batch", "standard")
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE api_keys SET max_priority = 'urgent'"))
    assert await store.tenants.caller_for_key(key) == Caller(acme, Share(Priority.BATCH))
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE api_keys SET priority = 'interactive', max_priority = 'batch'")
        )
    assert await store.tenants.caller_for_key(key) == Caller(acme, Share(Priority.INTERACTIVE))


def test_keys_create_stores_and_lists_a_prompt_normalisation_switch(db_url: str) -> None:
    """``--normalise-prompts`` / ``--no-normalise-prompts``: the key's own say over
    ``TALARIA_NORMALISE_PROMPTS``; neither: none of its own (``-``)."""
    made = {}
    for option in ("--normalise-prompts", "--no-normalise-prompts", None):
        options = [option] if option else []
        created = runner.invoke(keys_app, ["create", *options, "--url", db_url])
        assert created.exit_code == 0, created.output
        made[option] = created.output.strip()
    assert _caller(db_url, made["--normalise-prompts"]).normalise_prompts is True
    assert _caller(db_url, made["--no-normalise-prompts"]).normalise_prompts is False
    assert _caller(db_url, made[None]).normalise_prompts is None
    listed = _lines(runner.invoke(keys_app, ["list", "--url", db_url]).output)
    assert [line.split()[7] for line in listed] == ["normalise=on", "normalise=off", "normalise=-"]


@pytest.mark.asyncio
async def test_a_keys_priority_and_weight_reach_its_caller(store: SqlStore) -> None:
    acme = await store.tenants.create_tenant("acme")
    key = await store.tenants.create_api_key(acme, priority="interactive", weight=0.5)
    plain = await store.tenants.create_api_key(acme)
    assert await store.tenants.caller_for_key(key) == Caller(acme, Share(Priority.INTERACTIVE, 0.5))
    assert await store.tenants.caller_for_key(plain) == Caller(acme, Share(Priority.STANDARD, 1.0))
    assert await store.tenants.caller_for_key("tk-wrong") is None
    for priority, weight in (("urgent", 1.0), ("batch", 0.0), ("batch", 100.01)):
        with pytest.raises(ValueError):
            await store.tenants.create_api_key(acme, priority=priority, weight=weight)
    assert [(i.priority, i.weight) for i in await store.tenants.list_api_keys()] == [
        ("interactive", 0.5),
        ("standard", 1.0),
    ]
    auth = Authenticator([], store.tenants)
    await auth.start()
    assert await auth.caller(f"Bearer {key}", "203.0.113.7") == Caller(
        acme, Share(Priority.INTERACTIVE, 0.5)
    )


def test_keys_help_says_revoked_keys_still_close_the_proxy() -> None:
    for command in ("revoke", "delete"):
        shown = " ".join(runner.invoke(keys_app, [command, "--help"]).output.split())
        assert "serves nobody until a key is created" in shown, command
        assert "--allow-open" in shown, command


# -- the SQLite file ------------------------------------------------------------------------


@pytest.fixture
def umask_022() -> Iterator[None]:
    """A usual umask, so that a file created without care would be 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.usefixtures("umask_022")
def test_make_engine_creates_the_sqlite_file_private(tmp_path: Path) -> None:
    path = tmp_path / "new.db"

    async def main() -> None:
        engine = make_engine(f"sqlite+aiosqlite:///{path}")
        try:
            async with engine.begin() as conn:
                await conn.execute(text("CREATE TABLE t (x INTEGER)"))
                await conn.execute(text("INSERT INTO t VALUES (1)"))
                assert _mode(path) == 0o600
                assert _mode(Path(f"{path}-wal")) == 0o600
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert _mode(path) == 0o600


@pytest.mark.usefixtures("umask_022")
def test_migrating_a_new_sqlite_file_creates_it_private(tmp_path: Path) -> None:
    path = tmp_path / "migrated.db"
    asyncio.run(upgrade_async(f"sqlite+aiosqlite:///{path}"))
    assert path.stat().st_size > 0 and _mode(path) == 0o600


@pytest.mark.usefixtures("umask_022")
def test_an_existing_readable_file_keeps_its_mode_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "old.db"
    path.touch(mode=0o644)
    with caplog.at_level(logging.WARNING, logger="talaria.proxy.store.db"):
        asyncio.run(make_engine(f"sqlite+aiosqlite:///{path}").dispose())
    assert _mode(path) == 0o644
    assert any("mode 0644" in r.message and str(path) in r.message for r in caplog.records)


@pytest.mark.usefixtures("umask_022")
def test_the_data_dir_is_created_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "home" / "talaria"
    monkeypatch.setenv("TALARIA_DATA_DIR", str(target))
    assert data_dir() == target
    assert _mode(target) == 0o700
    target.chmod(0o750)
    assert data_dir() == target and _mode(target) == 0o750  # an existing one is left alone


def test_keys_create_refuses_a_bad_rate_limit_and_creates_nothing(db_url: str) -> None:
    for bad, named in (
        (["--rpm", "0"], "--rpm"),
        (["--rpm", "-1"], "--rpm"),
        (["--tpm", "0"], "--tpm"),
        (["--tpm", "-500"], "--tpm"),
        (["--rpm", "2147483648"], "--rpm"),  # past the 32-bit column
        (["--rpm", "1.5"], "--rpm"),
        (["--rpm", "60", "--tpm", "0"], "--tpm"),
    ):
        refused = runner.invoke(keys_app, ["create", "--tenant", "acme", *bad, "--url", db_url])
        assert refused.exit_code == 2, (bad, refused.output)
        shown = " ".join(refused.output.replace("│", " ").split())
        assert f"Invalid value for '{named}'" in shown, (bad, shown)
        assert "tk-" not in refused.output
    zero = runner.invoke(keys_app, ["create", "--rpm", "0", "--url", db_url])
    shown = " ".join(zero.output.replace("│", " ").split())
    assert "rpm must be a whole number from 1 to 2147483647 (got 0)" in shown
    assert _lines(runner.invoke(keys_app, ["list", "--all", "--url", db_url]).output) == []
    assert _count(db_url) == 0  # nothing was created


def test_keys_create_stores_and_lists_rate_limits(db_url: str) -> None:
    options = ["--tenant", "bulk", "--rpm", "60", "--tpm", "100000"]
    made = runner.invoke(keys_app, ["create", *options, "--url", db_url])
    assert made.exit_code == 0, made.output
    rpm_only = runner.invoke(keys_app, ["create", "--tenant", "ide", "--rpm", "5", "--url", db_url])
    assert rpm_only.exit_code == 0, rpm_only.output
    plain = runner.invoke(keys_app, ["create", "--tenant", "ide", "--url", db_url])
    assert plain.exit_code == 0, plain.output
    listed = _lines(runner.invoke(keys_app, ["list", "--url", db_url]).output)
    key_ids = [line.split()[0] for line in listed]
    assert [tuple(line.split()[5:7]) for line in listed] == [
        ("rpm=60", "tpm=100000"),
        ("rpm=5", "tpm=-"),
        ("rpm=-", "tpm=-"),
    ]
    limited = _caller(db_url, made.output.strip())
    assert limited.limits == RateLimits(key_ids[0], 60, 100000)
    assert _caller(db_url, rpm_only.output.strip()).limits == RateLimits(key_ids[1], 5, None)
    assert _caller(db_url, plain.output.strip()).limits is None  # not counted at all
