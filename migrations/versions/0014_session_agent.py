"""``sessions.agent``: the kind of agent a session comes from (proxy/sessions/identity.py
``agent_kind``: its ``User-Agent``'s product name, else where its session id came from); null
for sessions recorded before.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("agent", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("agent")
