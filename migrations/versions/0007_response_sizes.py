"""``responses.size_bytes``: the encoded size of a stored response (its response object, input
items, ids and times), which counts against its tenant's storage quota
(proxy/dialects/responses/quota.py), and an index on (tenant_id, expires_at, size_bytes) that holds
everything the quota's ``SUM`` per tenant reads. Rows stored before count the bytes of the
JSON text the database holds for them (a little more than the compact encoding new rows
count).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEX = "ix_responses_tenant_id_expires_at_size_bytes"
TEXT_COLUMNS = ("response", "input_items", "response_id", "tenant_id", "session_id", "model")
TIMESTAMP_BYTES = 2 * 8  # created_at, expires_at


def _octets(column: str, dialect: str) -> str:
    """SQL for the bytes of ``column``'s text (JSON columns: the text the database holds)."""
    if dialect == "postgresql":
        return f"octet_length({column}::text)"
    return f"length(CAST({column} AS BLOB))"


def upgrade() -> None:
    op.add_column(
        "responses",
        sa.Column("size_bytes", sa.BigInteger(), server_default="0", nullable=False),
    )
    dialect = op.get_bind().dialect.name
    size = " + ".join(_octets(c, dialect) for c in TEXT_COLUMNS)
    op.execute(f"UPDATE responses SET size_bytes = {size} + {TIMESTAMP_BYTES}")
    op.create_index(INDEX, "responses", ["tenant_id", "expires_at", "size_bytes"])


def downgrade() -> None:
    op.drop_index(INDEX, table_name="responses")
    with op.batch_alter_table("responses") as batch:
        batch.drop_column("size_bytes")
