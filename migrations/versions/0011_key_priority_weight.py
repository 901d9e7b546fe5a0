"""``api_keys.priority`` and ``api_keys.weight``: the class a key's calls get unless a header
says otherwise (``interactive``, ``standard``, ``batch``) and its tenant's share weight in the
node's fair queue, in (0, 100] (``talaria keys create --priority --weight``). Keys created
before get ``standard`` and 1.0, the columns' server defaults.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("priority", sa.String(), nullable=False, server_default="standard"),
    )
    op.add_column(
        "api_keys",
        sa.Column("weight", sa.Float(), nullable=False, server_default=sa.text("1.0")),
    )


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("weight")
        batch.drop_column("priority")
