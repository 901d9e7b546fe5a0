"""Proxy settings: environment variables with the ``TALARIA_`` prefix, or arguments.

Lists (``TALARIA_API_KEYS``, ``TALARIA_MODELS``, ``TALARIA_CATALOG_PATH``, ``TALARIA_RUNTIMES``,
``TALARIA_TRUSTED_PROXIES``) are comma-separated.

A plugin's settings live beside it, in its own room (the Responses dialect's in
proxy/dialects/responses/settings.py, placement's in proxy/placement/settings.py): a
:class:`PluginSettings` subclass, read from the same ``TALARIA_<FIELD>`` variables, or from
the arguments given to :class:`ProxySettings` (which keeps those it does not declare for
them). The app checks every plugin's when it is made (proxy/edge/settings.py), and ``talaria
serve`` before it starts, with the same messages as the proxy's own.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from talaria.core.body_deadline import BODY_TIMEOUT_S
from talaria.core.holds import DEFAULT_MAX_HINT_GAP_S
from talaria.core.http_edge import HEADER_TIMEOUT_S
from talaria.core.protocol import MIN_RUNTIME_TOKEN_CHARS
from talaria.proxy.contract.peer import trusted_networks

MIN_SECRET_CHARS = 32
"""The shortest ``TALARIA_CLUSTER_SECRET`` accepted (the replicas sign their forwards with it:
proxy/cluster/trust.py)."""

MIN_ADMIN_TOKEN_CHARS = 16
"""A shorter ``TALARIA_ADMIN_TOKEN`` is refused at start (with failed sign-ins throttled to
five a minute per address, 16 random characters are beyond guessing)."""

PAPER_MODELS = ["glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8"]


def _split(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class ProxySettings(BaseSettings):
    """Everything ``talaria serve`` and ``create_app`` are configured with: each field is the
    ``TALARIA_<FIELD>`` environment variable, or an argument."""

    # errors never echo their input: it holds secrets (keys, tokens, the cluster secret); the
    # runtime token is a SecretStr besides, so no repr of the settings shows it. Arguments it
    # does not declare are kept (``model_extra``) for the plugins' settings (module
    # docstring); a variable it does not declare is not read here (a plugin's reads its own)
    model_config = SettingsConfigDict(
        env_prefix="TALARIA_", extra="allow", hide_input_in_errors=True
    )

    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite in the user data dir"
    )
    auto_migrate: bool = Field(True, description="Upgrade the database schema at start")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted API keys (besides keys in the store)"
    )
    admin_token: str | None = Field(
        None,
        description=f"Bearer token of /admin; unset = off; at least {MIN_ADMIN_TOKEN_CHARS} "
        "characters",
    )
    allow_open: bool = Field(
        False,
        description="With no usable API key, serve every caller (remote ones too) without a "
        "key; otherwise only loopback callers are served until a key exists",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Reverse proxies whose X-Forwarded-For is believed (addresses or "
        "networks, comma-separated): from such a peer the client is the right-most address "
        "that is not one of them (proxy/contract/peer.py); empty: the connection's peer is "
        "the client, whatever the headers say",
    )
    metrics_token: str | None = Field(
        None,
        description="Bearer token of /metrics; unset = /metrics is open (aggregate counters only)",
    )
    runtimes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="URLs of runtime servers; when empty, an embedded simulated runtime",
    )
    runtime_token: SecretStr | None = Field(
        None,
        description="Bearer token sent to the runtime servers on every request (the "
        f"TALARIA_RUNTIME_TOKEN they were started with); at least {MIN_RUNTIME_TOKEN_CHARS} "
        "characters; unset: none is sent",
    )
    # embedded runtime (simulated engines)
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(PAPER_MODELS),
        description="Models of the embedded node (catalog names)",
    )
    catalog_path: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Extra catalog folders or TOML files"
    )
    nodes: int = Field(1, ge=1, description="Embedded nodes, each hosting every model")
    server: str = Field("h200x8", description="Server of the embedded nodes (catalog name)")
    profile: str = Field("default", description="Efficiency profile of the simulated engines")
    policy: str = Field("talaria", description="Scheduler flags of the embedded nodes")
    quantum_s: float = Field(60.0, gt=0, description="Slot quantum of the embedded nodes (s)")
    time_scale: float = Field(1.0, gt=0, description="Simulated seconds per real second")
    # routing
    router: str = Field("talaria", description="talaria, load-only, sticky or kv-aware")
    routing_seed: int = Field(0, description="Seed of the routers' tie-breaks")
    # limits
    max_request_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="Larger request bodies get 413"
    )
    max_inflight_per_tenant: int = Field(
        512, gt=0, description="Calls one tenant may have running; more get 429"
    )
    max_output_tokens: int = Field(
        4096,
        gt=0,
        description="Cap when a request sets none (and what such a call reserves for its "
        "output against its key's --tpm)",
    )
    rate_sync_s: float = Field(
        1.0,
        gt=0,
        description="How often a replica adds its API keys' rate limit counts to the store's "
        "and reads the totals back (s); several replicas may together pass a key's limit by "
        "one of these intervals of its calls (and their reserved tokens) through each other "
        "replica",
    )
    max_sessions_per_tenant: int = Field(
        10_000,
        gt=0,
        description="Live sessions (implicit and named) one tenant may have, each of a "
        "session's conversations (threads) counted; a call that would open one more gets 429",
    )
    max_threads_per_session: int = Field(
        64,
        gt=0,
        description="Live conversations (threads) one session may hold; beyond, its least "
        "recently used idle one is retired",
    )
    status_timeout_s: float = Field(
        5.0,
        gt=0,
        description="How long a runtime's status read may take before the runtime is left out "
        "of routing until it answers again (s)",
    )
    status_ttl_s: float = Field(
        0.05, ge=0, description="How long a runtime's status is reused for routing (s)"
    )
    status_stale_s: float = Field(
        0.0,
        ge=0,
        description="Past status_ttl_s, how much longer a status is still used while one "
        "refresh runs in the background (s; 0: the call waits for the fresh one). Off by "
        "default: a stale status can miss the KV a session's last call left on an instance "
        "and route its next call elsewhere",
    )
    # sessions
    session_idle_timeout_s: float = Field(
        600.0, gt=0, description="A session with no call for this long ends (wall seconds)"
    )
    max_hint_gap_s: float = Field(
        DEFAULT_MAX_HINT_GAP_S,
        gt=0,
        description="The longest tool gap a client's hint may claim (X-Talaria-Tool-Gap-Ms, "
        "the hint route): a longer one counts as this, for the proxy's reservation and the "
        "node's (wall seconds; 240: above the p99 real coding-agent tool call, 3.6 min, "
        "docs/sources.md §2)",
    )
    sim_tool_calls: int = Field(
        3, ge=0, description="Simulated engines answer after this many tool calls of a conversation"
    )
    # the session store: durability and faults (docs/operations.md)
    durability: Literal["commit", "async"] = Field(
        "commit",
        description="commit: a call's response completes only after its records are "
        "committed (group commit); async: records are written in the background (a crash "
        "can lose the last ~writer_flush_interval_s of them)",
    )
    commit_timeout_s: float = Field(
        30.0,
        gt=0,
        description="With durability=commit, how long a finished call waits for "
        "its records' commit before its client gets 503 (the records stay queued)",
    )
    writer_flush_interval_s: float = Field(
        0.05, gt=0, description="How long the writer gathers records when nobody waits (s)"
    )
    writer_max_pending: int = Field(
        50_000, ge=1, description="Queued records beyond which new calls get 503"
    )
    drain_timeout_s: float = Field(
        30.0, gt=0, description="At shutdown, the longest wait for calls and records (s)"
    )
    admin_read_timeout_s: float = Field(
        5.0, gt=0, description="Admin reads that take longer get 503 (s)"
    )
    dead_letter_path: str | None = Field(
        None,
        description="JSON-lines file of records the database would not take; "
        "default: dead-letters.jsonl next to the SQLite file, or in the data dir",
    )
    replica_url: str | None = Field(
        None,
        description="The URL other proxy replicas reach this one at; set, the proxy joins the "
        "replicas sharing its PostgreSQL database (docs/operations.md, Several replicas)",
    )
    replica_heartbeat_s: float = Field(
        1.0, gt=0, description="How often a replica says it is alive and reads its peers (s)"
    )
    replica_ttl_s: float = Field(
        5.0, gt=0, description="A replica not heard from for this long is taken as gone (s)"
    )
    cluster_secret: str | None = Field(
        None,
        min_length=MIN_SECRET_CHARS,
        description="Shared secret of the replicas (at least 32 characters, the same on "
        "every one): they sign the requests they forward to each other with it; required "
        "with replica_url",
    )
    session_headers: str = Field(
        "",
        description="More headers that name a session, for clients that send their own: "
        "comma-separated 'name' or 'name:rank' (rank: the 1-based place among the session "
        "sources, docs/proxy.md; default: after the built-in ones); a name that is not an "
        "HTTP header name, a built-in one or a rank out of range is refused at start",
    )
    normalise_prompts: bool = Field(
        True,
        description="Take the volatile parts of a call's system text (Claude Code's "
        "attribution line, the patterns below) out of the prompt the engine gets, so that "
        "its prefix stays the same from turn to turn; an API key may say otherwise (talaria "
        "keys create --normalise-prompts / --no-normalise-prompts). Sessions are found "
        "without them either way (proxy/sessions/normalise.py)",
    )
    prompt_patterns: str = Field(
        "",
        description="More volatile parts of system text: one Python regular expression a "
        "line (blank lines ignored), whose matches are removed; one that does not compile "
        "is refused at start",
    )
    replica_affinity: Literal["rendezvous", "ingress"] = Field(
        "rendezvous",
        description="rendezvous: the replica a call reaches forwards it to its session's "
        "owner; ingress: the balancer hashes calls on the session headers "
        "(deploy/nginx/talaria.conf), so a call that carries one is served where it lands",
    )
    replica_read_timeout_s: float = Field(
        600.0,
        gt=0,
        description="Longest wait between two bytes of a call forwarded to its owner replica "
        "(s); past it the client gets 503 replica_unavailable",
    )
    loop_stall_s: float = Field(
        5.0,
        gt=0,
        description="An event loop blocked this long is a stall: logged with its stack, and "
        "/healthz answers 503 during it and for 60 s after",
    )
    # the HTTP edge (core/http_edge.py, core/body_deadline.py; docs/operations.md, Bounds)
    header_timeout_s: float = Field(
        HEADER_TIMEOUT_S,
        gt=0,
        description="A connection whose request line and headers have not arrived this long "
        "after it opened (or after its previous response) is closed (s)",
    )
    body_timeout_s: float = Field(
        BODY_TIMEOUT_S,
        gt=0,
        description="A request whose whole body has not arrived this long after the proxy "
        "began to read it gets 408 (s)",
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="Open connections past which a new one gets 503 at once; unset: half "
        "the process's descriptor limit",
    )
    freeze_gc: bool = Field(
        False,
        description="gc.freeze() after start-up (talaria serve sets it): the "
        "objects of start-up leave the collector's scans, which otherwise stall the loop",
    )

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        if value and len(value) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"TALARIA_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters "
                f"(it has {len(value)}); e.g. `openssl rand -hex 24`"
            )
        return value

    @field_validator("runtime_token", mode="before")
    @classmethod
    def _a_real_token(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip() or None  # a Secret file's trailing newline is no part of it
            if value is not None and len(value) < MIN_RUNTIME_TOKEN_CHARS:
                raise ValueError(
                    f"TALARIA_RUNTIME_TOKEN must be at least {MIN_RUNTIME_TOKEN_CHARS} "
                    f"characters (it has {len(value)})"
                )
        return value

    @field_validator("api_keys", "models", "catalog_path", "runtimes", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split(value)

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        value = _split(value)
        if isinstance(value, list):
            trusted_networks(str(v) for v in value)  # ValueError naming a bad one
        return value

    @model_validator(mode="after")
    def _replicas_share_a_secret(self) -> ProxySettings:
        if self.replica_url is not None and self.cluster_secret is None:
            raise ValueError(
                "TALARIA_REPLICA_URL needs TALARIA_CLUSTER_SECRET: a secret of at least "
                f"{MIN_SECRET_CHARS} characters, the same on every replica (for example "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return self


class PluginSettings(BaseSettings):
    """A plugin's settings, declared beside it (module docstring): its fields are
    ``TALARIA_<FIELD>`` variables as :class:`ProxySettings`' are, and its validation errors
    read as theirs ("validation error for ProxySettings"). Read with :meth:`of`."""

    model_config = SettingsConfigDict(
        env_prefix="TALARIA_", extra="ignore", hide_input_in_errors=True, title="ProxySettings"
    )

    @classmethod
    def of(cls, settings: ProxySettings) -> Self:
        """The plugin's settings: the arguments ``settings`` was given for its fields, else
        their variables, else their defaults (pydantic's ``ValidationError`` for a bad one)."""
        given = settings.model_extra or {}
        return cls(**{name: value for name, value in given.items() if name in cls.model_fields})
