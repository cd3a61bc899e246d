"""Tables of the event store (SQLAlchemy Core). Alembic migrations create and evolve them;
this module mirrors the latest migration so queries can be written against it."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

personas = sa.Table(
    "personas", metadata,
    sa.Column("persona", sa.String(64), primary_key=True),
    sa.Column("n_days", sa.Integer, nullable=False),
    sa.Column("first_day", sa.Integer, nullable=False),
    sa.Column("last_day", sa.Integer, nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("last_ts", sa.String(40), nullable=False),
    sa.Column("head", sa.String(32), nullable=False),
    sa.Column("world_hash", sa.String(32), nullable=False),
)

events = sa.Table(
    "events", metadata,
    sa.Column("persona", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("day", sa.Integer, nullable=False),
    sa.Column("ts", sa.String(40), nullable=False),
    sa.Column("prev", sa.String(32), nullable=False),
    sa.Column("event_id", sa.String(32), nullable=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),
)

days = sa.Table(
    "days", metadata,
    sa.Column("persona", sa.String(64), primary_key=True),
    sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("first_seq", sa.BigInteger, nullable=False),
    sa.Column("last_seq", sa.BigInteger, nullable=False),
    sa.Column("first_ts", sa.String(40), nullable=False),
    sa.Column("last_ts", sa.String(40), nullable=False),
    sa.Column("head", sa.String(32), nullable=False),
    sa.Column("world_hash", sa.String(32), nullable=False, index=True),
    sa.Column("manifest", sa.LargeBinary, nullable=False),
)

blobs = sa.Table(
    "blobs", metadata,
    sa.Column("digest", sa.String(32), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=False),
)

episodes = sa.Table(
    "episodes", metadata,
    sa.Column("episode_id", sa.String(32), primary_key=True),
    sa.Column("world_hash", sa.String(32), nullable=False, index=True),
    sa.Column("persona", sa.String(64), nullable=False),
    sa.Column("day", sa.Integer, nullable=False),
    sa.Column("final_hash", sa.String(32), nullable=True),
    sa.Column("n_calls", sa.Integer, nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),  # the Episode as JSON, opaque here
)

claims = sa.Table(
    "claims", metadata,
    sa.Column("scope", sa.String(200), primary_key=True),
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("body", sa.LargeBinary, nullable=False),  # opaque to the store
)
