"""``api_keys.normalise_prompts`` and ``calls.normalised``: whether the engine gets a key's
calls' prompts normalised (``talaria keys create --normalise-prompts`` /
``--no-normalise-prompts``; null: as ``TALARIA_NORMALISE_PROMPTS`` says, which is what keys
created before do), and the volatile parts taken out of a call's system text (a JSON list of
proxy/sessions/normalise.py's row names; null: none, and for calls recorded before).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("normalise_prompts", sa.Boolean(), nullable=True))
    op.add_column("calls", sa.Column("normalised", sa.JSON(none_as_null=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("normalised")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("normalise_prompts")
