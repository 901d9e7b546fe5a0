"""One tenant cannot evict another's learned tool gaps by rotating its ``User-Agent`` (issue 46,
Low), through the proxy's HTTP API to its embedded node (``talaria-learned``: the node learns
gaps per (tenant, model, agent kind), the kind from the ``User-Agent``: core/gaps.py).

The node's bound on populations is set to 16 here (1,024 by default, which would take a
thousand calls to show the same): before the fix, a tenant whose every call named a new
agent added a population per call and pushed the other tenant's out; now its kinds past
``max_agents`` share its pooled population and nobody else's is evicted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from talaria.core.gaps import DEFAULT_MAX_AGENTS, POOLED_AGENT, PopulationGaps
from talaria.proxy.callpath.runner import tenant_digest
from talaria.proxy.contract.settings import ProxySettings
from talaria.proxy.edge.app import create_app
from talaria.proxy.store.db import make_engine, make_sessionmaker
from talaria.proxy.store.migrate import upgrade_async
from talaria.proxy.store.repository import SqlStore

MODEL = "glm-4.5-fp8"
BOUND = 16


async def _keys(url: str, tenants: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """tenant name → (its id, an API key of it)."""
    await upgrade_async(url)
    engine = make_engine(url)
    try:
        store = SqlStore(make_sessionmaker(engine)).tenants
        made = {}
        for name in tenants:
            tenant_id = await store.create_tenant(name)
            made[name] = (tenant_id, await store.create_api_key(tenant_id))
        return made
    finally:
        await engine.dispose()


def _calls(client: TestClient, key: str, session: str, agents: list[str]) -> None:
    """One session's calls, one after the other, the i-th sent as ``agents[i]``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"Start {session}."}]
    for i, agent in enumerate(agents):
        reply = client.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 4, "tools": []},
            headers={
                "authorization": f"Bearer {key}",
                "x-talaria-session-id": session,
                "user-agent": f"{agent}/1.0",
            },
        )
        assert reply.status_code == 200, reply.text
        messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": f"{i}"}]


def test_a_tenant_rotating_its_user_agent_evicts_only_its_own_gap_fits(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    keys = asyncio.run(_keys(url, ("victim", "rotator")))
    settings = ProxySettings(
        database_url=url, models=[MODEL], policy="talaria-learned", time_scale=1000.0
    )
    app = create_app(settings)
    with TestClient(app) as client:
        (runtime,) = app.state.talaria.pool.runtimes
        population: PopulationGaps = runtime.node._sessions.population
        population.max_keys = BOUND
        victim_id, victim_key = keys["victim"]
        _calls(client, victim_key, "v", ["claude-cli"] * 3)
        victim = (tenant_digest(victim_id), MODEL, "claude-cli")
        assert victim in population
        rotator_id, rotator_key = keys["rotator"]
        _calls(client, rotator_key, "r", [f"bot{i}" for i in range(2 * BOUND)])
        assert victim in population  # before the fix: evicted
        rotator = [k for k in population.held_keys() if k[0] == tenant_digest(rotator_id)]
        assert len(rotator) == DEFAULT_MAX_AGENTS + 1
        assert (tenant_digest(rotator_id), MODEL, POOLED_AGENT) in rotator
