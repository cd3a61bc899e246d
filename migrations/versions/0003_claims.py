"""Claims: what parallel workers take before they make something others must not duplicate.

Revision ID: 0003_claims
Revises: 0002_episodes
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_claims"
down_revision = "0002_episodes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("scope", sa.String(200), primary_key=True),
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("body", sa.LargeBinary, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("claims")
