"""Alembic revisions, hand-written (a package so that they ship in the wheel)."""
