"""``api_keys.rpm`` and ``api_keys.tpm``: a key's calls and tokens (prompt + output) per minute
(``talaria keys create --rpm --tpm``), both nullable: keys created before, and keys created
without them, are not limited. ``key_usage``: the calls and tokens of each rate-limited key per
minute (its start, UTC), which the replicas add their counts to (proxy/store/usage.py).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("rpm", sa.Integer(), nullable=True))
    op.add_column("api_keys", sa.Column("tpm", sa.Integer(), nullable=True))
    op.create_table(
        "key_usage",
        sa.Column("key_id", sa.String(), nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", "window_start", name="pk_key_usage"),
    )


def downgrade() -> None:
    op.drop_table("key_usage")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("tpm")
        batch.drop_column("rpm")
