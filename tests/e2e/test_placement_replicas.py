"""Placement with two proxy replicas on one PostgreSQL and three runtime processes, all real
processes on loopback (proxy/placement/loop.py): one replica looks; a cold start is made by
the replica that serves the call, looking or not; every replica reads the same demand,
metered by the runtimes from all replicas' calls."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.e2e.replicas import MODEL, Deployment, owned_by

LIBRARY = """
[[model]]
name = "gpt-oss-120b"
engine = "sim"
"""
POLLS = 600
"""Reads of the replicas' placement state before a test gives up (each takes milliseconds)."""


def _chat(replica: str, model: str, session: str) -> httpx.Response:
    return httpx.post(
        replica + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": f"work of {session}"}]},
        headers={"x-talaria-session-id": session},
        timeout=120,
    )


@pytest.mark.replicas(0)
def test_one_replica_looks_and_every_replica_sees_all_the_demand(
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    library = tmp_path / "library.toml"
    library.write_text(LIBRARY)
    env = {"TALARIA_PLACEMENT_LIBRARY": str(library), "TALARIA_PLACEMENT_INTERVAL_S": "0.2"}
    for _ in range(2):
        deployment.add_replica(**env)

    def looks() -> list[int]:
        return [deployment.admin(i, "/admin/placement")["looks"] for i in (0, 1)]

    # both see each other now (add_replica waits for it): from here one replica looks (the
    # first looked alone before the second came)
    before = looks()
    grown = [0, 0]
    for _ in range(POLLS):
        grown = [now - then for now, then in zip(looks(), before, strict=True)]
        if max(grown) >= 5:
            break
        time.sleep(0.05)  # the looks run on the replicas' own 0.2 s timers
    assert sorted(grown)[0] == 0 and sorted(grown)[1] >= 5, (before, grown)
    follower = grown.index(0)

    # a call whose session the replica that does not look owns: that replica cold-starts it
    urls = [r.base_url for r in deployment.replicas]
    [session] = owned_by(urls[follower], urls, 1, "cold")
    cold = _chat(urls[1 - follower], "gpt-oss-120b", session)  # forwarded to its owner
    assert cold.status_code == 200, cold.text
    moves = [deployment.admin(i, "/admin/placement")["moves"] for i in (0, 1)]
    assert [(m["model"], m["reason"], m["outcome"]) for m in moves[follower]] == [
        ("gpt-oss-120b", "cold-start", "ok")
    ]
    assert moves[1 - follower] == []

    # sessions sent to both replicas: each replica reads every runtime's meter
    for i in range(4):
        answer = _chat(deployment.replicas[i % 2].base_url, MODEL, f"s{i}-{uuid.uuid4().hex}")
        assert answer.status_code == 200, answer.text
    for replica in (0, 1):
        demand = deployment.admin(replica, "/admin/placement")["demand"]
        assert demand == {MODEL: 4.0, "gpt-oss-120b": 1.0}, (replica, demand)
