"""``calls.how`` and ``calls.thread``: how the call's session was found (new, continued, retry,
corrected, thread, compacted, child, adopted: proxy/sessions/index.py) and the session's thread
it ran in (0: its first conversation); null for calls recorded before.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("calls", sa.Column("how", sa.String(), nullable=True))
    op.add_column("calls", sa.Column("thread", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("thread")
        batch.drop_column("how")
