"""Initial schema: tenants, API keys, sessions, calls, routing decisions, reservations, hints,
runtime instances.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    """Create every table and index."""
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_tenants"),
        sa.UniqueConstraint("name", name="uq_tenants_name"),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("tenant_id", sa.String(), nullable=False),
        sa.Column("key_hash", sa.String(), nullable=False),
        sa.Column("prefix", sa.String(), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name="fk_api_keys_tenant_id_tenants"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_tenant_id", "api_keys", ["tenant_id"])

    op.create_table(
        "sessions",
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("tenant_id", sa.String(), nullable=False),
        sa.Column("parent_session_id", sa.String(), nullable=True),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        _ts("started_at"),
        _ts("last_call_at"),
        _ts("ended_at", nullable=True),
        sa.Column("end_reason", sa.String(), nullable=True),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_sessions"),
    )
    op.create_index("ix_sessions_tenant_id", "sessions", ["tenant_id"])
    op.create_index("ix_sessions_parent_session_id", "sessions", ["parent_session_id"])
    op.create_index("ix_sessions_started_at", "sessions", ["started_at"])

    op.create_table(
        "calls",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("call_index", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("instance", sa.String(), nullable=True),
        _ts("arrived_at"),
        _ts("finished_at", nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("queue_s", sa.Float(), nullable=True),
        sa.Column("prefill_s", sa.Float(), nullable=True),
        sa.Column("decode_s", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("kv_source", sa.String(), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("tool_gap_hint_s", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.session_id"], name="fk_calls_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("request_id", name="pk_calls"),
    )
    op.create_index("ix_calls_session_id_call_index", "calls", ["session_id", "call_index"])

    op.create_table(
        "routing_decisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("router", sa.String(), nullable=False),
        sa.Column("instance", sa.String(), nullable=True),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("scores", sa.JSON(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_routing_decisions"),
    )
    for column in ("request_id", "session_id", "reason"):
        op.create_index(f"ix_routing_decisions_{column}", "routing_decisions", [column])

    op.create_table(
        "reservations",
        sa.Column("reservation_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("instance", sa.String(), nullable=False),
        sa.Column("held_bytes", sa.Float(), nullable=False),
        _ts("created_at"),
        _ts("expected_return_at"),
        _ts("expires_at"),
        _ts("released_at", nullable=True),
        sa.Column("release_reason", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("reservation_id", name="pk_reservations"),
    )
    op.create_index("ix_reservations_session_id", "reservations", ["session_id"])

    op.create_table(
        "hints",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        _ts("at"),
        sa.Column("expected_s", sa.Float(), nullable=True),
        sa.Column("tool", sa.String(), nullable=True),
        sa.Column("kind", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hints"),
    )
    op.create_index("ix_hints_session_id", "hints", ["session_id"])

    op.create_table(
        "runtime_instances",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("url", sa.String(), nullable=True),
        sa.Column("models", sa.JSON(), nullable=False),
        _ts("last_seen_at"),
        sa.Column("status", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_runtime_instances"),
    )


def downgrade() -> None:
    """Drop everything, dependents first."""
    op.drop_table("runtime_instances")
    op.drop_index("ix_hints_session_id", table_name="hints")
    op.drop_table("hints")
    op.drop_index("ix_reservations_session_id", table_name="reservations")
    op.drop_table("reservations")
    for column in ("reason", "session_id", "request_id"):
        op.drop_index(f"ix_routing_decisions_{column}", table_name="routing_decisions")
    op.drop_table("routing_decisions")
    op.drop_index("ix_calls_session_id_call_index", table_name="calls")
    op.drop_table("calls")
    for column in ("started_at", "parent_session_id", "tenant_id"):
        op.drop_index(f"ix_sessions_{column}", table_name="sessions")
    op.drop_table("sessions")
    op.drop_index("ix_api_keys_tenant_id", table_name="api_keys")
    op.drop_table("api_keys")
    op.drop_table("tenants")
