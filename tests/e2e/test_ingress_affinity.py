"""nginx in front of proxy replicas run with TALARIA_REPLICA_AFFINITY=ingress, all real
processes on loopback (PostgreSQL, runtime nodes, replicas, Debian's nginx with
deploy/nginx/talaria.conf as shipped, only its replica list and port filled in):

- a session that names itself in a header reaches one replica for all its calls, which serves
  it there: nothing is forwarded;
- a call without such a header is spread round-robin by nginx and placed by the replicas'
  own rendezvous hash (forwarded to its owner), and stays one session;
- a replica joining and then leaving moves some sessions away and back: each goes on as one
  session, its calls numbered 0, 1, 2, ... in the store with none counted twice (the replica
  it comes back to forgets what it held once the replicas changed, and takes it over from the
  store).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.harness.nginx import CONF, Nginx, nginx_binary
from talaria.proxy.cluster.owner import AFFINITY_HEADERS, NGINX_KEY, nginx_session_maps
from tests.e2e.replicas import STOPPED_BY_SIGTERM, Deployment, Session, wait_for_peers
from tests.support import unavailable

INGRESS = {"TALARIA_REPLICA_AFFINITY": "ingress"}
HEADERS = ("x-talaria-session-id", "x-claude-code-session-id", "session-id", "x-session-id")
"""The session headers the agents send (docs/agents.md), one per session in turn."""


def _nginx() -> str:
    found = nginx_binary()
    if found is None:
        unavailable(
            "no nginx: bash scripts/apt-provide.sh nginx-light nginx",
            under_ci="no nginx: scripts/test.sh installs it (scripts/apt-provide.sh)",
        )
    return found


def _hostport(url: str) -> str:
    return url.removeprefix("http://")


def test_the_shipped_config_hashes_the_name_the_replicas_give_a_session() -> None:
    """The balancer's key is the proxy's own rule (proxy/cluster/owner.py ``affinity``): the
    first of the ranked session headers, as the maps say it."""
    text = CONF.read_text()
    assert nginx_session_maps() in text
    (key,) = re.findall(r"^\s*hash (\S+) consistent;", text, re.M)
    assert key == f"${NGINX_KEY}"
    assert [m.replace("_", "-") for m in re.findall(r"^map \$http_(\w+) ", text, re.M)] == list(
        AFFINITY_HEADERS
    )


class Rounds:
    """Sessions driven through nginx, one call each per round, all at once."""

    def __init__(
        self,
        url: str,
        sessions: list[Session],
        headers: dict[str, str],
        extra: dict[str, str] | None = None,
    ) -> None:
        self.url, self.sessions, self.headers = url, sessions, headers
        self.extra = extra or {}
        """Lower-ranked headers sent with every call, each with a value new every call."""
        self.upstreams: dict[str, list[str]] = {s.name: [] for s in sessions}
        self.forwarded: dict[str, int] = {s.name: 0 for s in sessions}

    async def run(self, rounds: int) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(rounds):
                await asyncio.gather(*(self._one(client, s) for s in self.sessions))

    async def _one(self, client: httpx.AsyncClient, session: Session) -> None:
        header = self.headers.get(session.name)
        headers = {header: session.name} if header else {}
        headers |= {name: f"{prefix}-{uuid.uuid4().hex[:8]}" for name, prefix in self.extra.items()}
        try:
            response = await client.post(
                self.url + "/v1/chat/completions", json=session.body(), headers=headers
            )
        except httpx.HTTPError as exc:
            session.failures.append(repr(exc))
            return
        if response.status_code != 200:
            session.failures.append(f"{response.status_code} {response.text}")
            return
        session.answered(response)
        self.upstreams[session.name].append(response.headers["x-upstream"])
        self.forwarded[session.name] += "x-talaria-replica" in response.headers


def _replicas(running: Deployment, n: int) -> list[str]:
    for _ in range(n):
        running.add_replica(None, **INGRESS)
    return [_hostport(r.base_url) for r in running.replicas]


@pytest.mark.replicas(0)
def test_sessions_named_by_a_header_are_served_where_nginx_sends_them(
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    nginx = Nginx(_nginx(), tmp_path / "nginx")
    nginx.configure(_replicas(deployment, 3))
    tag = uuid.uuid4().hex[:6]
    named = [Session(f"n{i}-{tag}", explicit=True) for i in range(12)]
    implicit = [Session(f"i{i}-{tag}", explicit=False) for i in range(4)]
    headers = {s.name: HEADERS[i % len(HEADERS)] for i, s in enumerate(named)}
    with nginx.running():
        rounds = Rounds(nginx.url, [*named, *implicit], headers)
        asyncio.run(rounds.run(4))
    assert [f for s in [*named, *implicit] for f in s.failures] == []
    for session in [*named, *implicit]:
        assert len(session.keys) == 1, (session.name, session.keys)  # one session each
    for session in named:
        assert len(set(rounds.upstreams[session.name])) == 1  # nginx sent it home every time
        assert rounds.forwarded[session.name] == 0  # and that replica served it
    assert len({rounds.upstreams[s.name][0] for s in named}) >= 2  # spread over the replicas
    # calls without a session header: nginx spreads them, the replicas forward to the owner
    implicit_upstreams = {u for s in implicit for u in rounds.upstreams[s.name]}
    assert len(implicit_upstreams) >= 2
    assert sum(rounds.forwarded[s.name] for s in implicit) > 0


@pytest.mark.replicas(0)
def test_sessions_moved_by_a_replica_joining_and_leaving_stay_whole(
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    nginx = Nginx(_nginx(), tmp_path / "nginx")
    first = _replicas(deployment, 2)
    nginx.configure(first)
    tag = uuid.uuid4().hex[:6]
    sessions = [Session(f"m{i}-{tag}", explicit=True) for i in range(16)]
    headers = {s.name: "x-claude-code-session-id" for s in sessions}
    with nginx.running():
        rounds = Rounds(nginx.url, sessions, headers)
        asyncio.run(rounds.run(3))
        joined = _replicas(deployment, 1)[-1]
        nginx.reload([*first, joined])
        asyncio.run(rounds.run(3))
        leaving = deployment.replicas.pop()
        leaving.sigterm()
        assert leaving.wait(60) in STOPPED_BY_SIGTERM
        wait_for_peers(deployment)  # the others saw it leave
        nginx.reload(first)
        asyncio.run(rounds.run(3))
    assert [f for s in sessions for f in s.failures] == []
    away = [s for s in sessions if joined in rounds.upstreams[s.name]]
    assert away, "no session moved to the replica that joined"
    for session in sessions:
        assert len(session.keys) == 1, (session.name, session.keys)
        assert rounds.forwarded[session.name] == 0
        (key,) = session.keys
        timeline: dict[str, Any] = deployment.admin(0, f"/admin/sessions/{key}")
        assert [c["call_index"] for c in timeline["calls"]] == list(range(9)), session.name


@pytest.mark.replicas(0)
def test_a_client_varying_a_lower_ranked_header_stays_one_session_on_one_replica(
    deployment: Deployment,
    tmp_path: Path,
) -> None:
    """Issue 36, finding 6: nginx hashed all five headers joined while the proxy names a
    session by the highest-ranked one, so a client that varied a lower-ranked header reached
    several replicas with one session (call indices 0, 1, 1, 2, 2, ...). Now both take the
    first ranked header: one replica, one session, its calls numbered without a repeat."""
    nginx = Nginx(_nginx(), tmp_path / "nginx")
    nginx.configure(_replicas(deployment, 3))
    tag = uuid.uuid4().hex[:6]
    sessions = [Session(f"v{i}-{tag}", explicit=True) for i in range(6)]
    headers = {s.name: "x-talaria-session-id" for s in sessions}
    with nginx.running():
        rounds = Rounds(nginx.url, sessions, headers, extra={"x-session-id": "opencode"})
        asyncio.run(rounds.run(5))
    assert [f for s in sessions for f in s.failures] == []
    for session in sessions:
        assert len(set(rounds.upstreams[session.name])) == 1, rounds.upstreams[session.name]
        assert len(session.keys) == 1 and rounds.forwarded[session.name] == 0
        (key,) = session.keys
        timeline: dict[str, Any] = deployment.admin(0, f"/admin/sessions/{key}")
        assert [c["call_index"] for c in timeline["calls"]] == list(range(5)), session.name
