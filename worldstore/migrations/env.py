"""Alembic environment: migrations run on the connection the store opened (see
worldstore.open), inside its transaction."""

from __future__ import annotations

from alembic import context

from worldstore.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only for `alembic` run by hand
    raise SystemExit("run migrations through worldstore.open_store, not the alembic CLI")

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
context.run_migrations()
