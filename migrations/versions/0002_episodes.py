"""Episodes: what agents did on instances of stored worlds (the body is the Episode JSON).

Revision ID: 0002_episodes
Revises: 0001_initial
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_episodes"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "episodes",
        sa.Column("episode_id", sa.String(32), primary_key=True),
        sa.Column("world_hash", sa.String(32), nullable=False),
        sa.Column("persona", sa.String(64), nullable=False),
        sa.Column("day", sa.Integer, nullable=False),
        sa.Column("final_hash", sa.String(32), nullable=True),
        sa.Column("n_calls", sa.Integer, nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_episodes_world_hash", "episodes", ["world_hash"])


def downgrade() -> None:
    op.drop_index("ix_episodes_world_hash", table_name="episodes")
    op.drop_table("episodes")
