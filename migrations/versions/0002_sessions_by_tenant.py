"""Sessions keyed by the proxy (tenant-scoped client ids), the API of each call, stored
responses.

- ``sessions.external_id`` (the client's id; backfilled with ``session_id``, which was the
  client's id until now) and ``sessions.identity_source``, indexed by (tenant, external id);
- ``calls.api`` (chat, completions, messages, responses);
- ``responses``: Responses API objects kept for ``previous_response_id``.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("external_id", sa.String(), nullable=True))
    op.add_column("sessions", sa.Column("identity_source", sa.String(), nullable=True))
    op.execute("UPDATE sessions SET external_id = session_id")
    with op.batch_alter_table("sessions") as batch:
        batch.alter_column("external_id", existing_type=sa.String(), nullable=False)
    op.create_index("ix_sessions_tenant_id_external_id", "sessions", ["tenant_id", "external_id"])
    op.add_column("calls", sa.Column("api", sa.String(), nullable=True))
    op.create_table(
        "responses",
        sa.Column("response_id", sa.String(), nullable=False),
        sa.Column("tenant_id", sa.String(), nullable=False),
        sa.Column("session_id", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("input_items", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("response_id", name="pk_responses"),
    )
    op.create_index("ix_responses_tenant_id", "responses", ["tenant_id"])
    op.create_index("ix_responses_expires_at", "responses", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_responses_expires_at", table_name="responses")
    op.drop_index("ix_responses_tenant_id", table_name="responses")
    op.drop_table("responses")
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("api")
    op.drop_index("ix_sessions_tenant_id_external_id", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("identity_source")
        batch.drop_column("external_id")
