"""Initial event store: personas, events, days, blobs.

Revision ID: 0001_initial
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "personas",
        sa.Column("persona", sa.String(64), primary_key=True),
        sa.Column("n_days", sa.Integer, nullable=False),
        sa.Column("first_day", sa.Integer, nullable=False),
        sa.Column("last_day", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("last_ts", sa.String(40), nullable=False),
        sa.Column("head", sa.String(32), nullable=False),
        sa.Column("world_hash", sa.String(32), nullable=False),
    )
    op.create_table(
        "events",
        sa.Column("persona", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("ts", sa.String(40), nullable=False),
        sa.Column("prev", sa.String(32), nullable=False),
        sa.Column("event_id", sa.String(32), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "days",
        sa.Column("persona", sa.String(64), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("first_seq", sa.BigInteger, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("first_ts", sa.String(40), nullable=False),
        sa.Column("last_ts", sa.String(40), nullable=False),
        sa.Column("head", sa.String(32), nullable=False),
        sa.Column("world_hash", sa.String(32), nullable=False),
        sa.Column("manifest", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_days_world_hash", "days", ["world_hash"])
    op.create_table(
        "blobs",
        sa.Column("digest", sa.String(32), primary_key=True),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("blobs")
    op.drop_index("ix_days_world_hash", table_name="days")
    op.drop_table("days")
    op.drop_table("events")
    op.drop_table("personas")
