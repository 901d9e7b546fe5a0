"""``calls.engine_intake_s``, ``engine_queue_s``, ``engine_prefill_s``, ``engine_decode_s``: a
call's parts as the engine itself timed them (vLLM's EngineCore timestamps,
``core.types.EngineTimes``), in wall seconds; null for calls recorded before and for engines that
keep no timestamps of their own.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("engine_intake_s", "engine_queue_s", "engine_prefill_s", "engine_decode_s")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("calls", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        for name in COLUMNS:
            batch.drop_column(name)
