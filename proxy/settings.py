"""Proxy settings: environment variables with the ``TALARIA_`` prefix, or arguments.

Lists (``TALARIA_API_KEYS``, ``TALARIA_MODELS``, ``TALARIA_CATALOG_PATH``) are comma-separated.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PAPER_MODELS = ["glm-4.5-fp8", "qwen3-235b-a22b-bf16", "qwen3-coder-480b-a35b-fp8"]


def _split(value: object) -> object:
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class ProxySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TALARIA_", extra="ignore")

    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default: SQLite in the user data dir"
    )
    auto_migrate: bool = Field(True, description="Upgrade the database schema at start")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted API keys (besides keys in the store)"
    )
    admin_token: str | None = Field(None, description="Bearer token of /admin; unset = off")
    runtimes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="URLs of runtime servers; when empty, an embedded simulated runtime",
    )
    # embedded runtime (simulated engines)
    models: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(PAPER_MODELS))
    catalog_path: Annotated[list[str], NoDecode] = Field(default_factory=list)
    nodes: int = Field(1, ge=1)
    server: str = "h200x8"
    profile: str = "default"
    policy: str = Field("talaria", description="Scheduler flags of the embedded nodes")
    quantum_s: float = Field(60.0, gt=0)
    time_scale: float = Field(1.0, gt=0, description="Simulated seconds per real second")
    # routing
    router: str = "talaria"
    routing_seed: int = 0
    # limits
    max_request_bytes: int = Field(8 * 1024 * 1024, gt=0)
    max_inflight_per_tenant: int = Field(512, gt=0)
    max_output_tokens: int = Field(4096, gt=0, description="Cap when a request sets none")
    status_ttl_s: float = Field(0.05, ge=0)
    # sessions and stored responses
    session_idle_timeout_s: float = Field(
        600.0, gt=0, description="A session with no call for this long ends (clock seconds)"
    )
    sim_tool_calls: int = Field(
        3, ge=0, description="Simulated engines answer after this many tool calls of a conversation"
    )
    store_responses: bool = Field(
        True, description="Keep Responses API objects for previous_response_id (false: never)"
    )
    responses_ttl_s: float = Field(7 * 24 * 3600.0, gt=0, description="How long they are kept")
    writer_flush_interval_s: float = Field(0.05, gt=0)

    @field_validator("api_keys", "models", "catalog_path", "runtimes", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return _split(value)
