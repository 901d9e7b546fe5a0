"""``calls.how``, ``calls.thread`` and ``calls.drift_at``: how the call's session was found (new,
continued, retry, corrected, drifted, thread, compacted, child, adopted:
proxy/sessions/index.py), the session's thread it ran in (0: its first conversation), and for a
drifted call the first message it rewrote; null for calls recorded before.

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
    op.add_column("calls", sa.Column("drift_at", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("drift_at")
        batch.drop_column("thread")
        batch.drop_column("how")
