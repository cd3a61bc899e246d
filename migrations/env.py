"""Alembic environment of the event store.

The store runs its migrations on the connection it opened (``worldstore.open``), inside
its transaction: the connection comes in ``config.attributes``. From a checkout,
``alembic upgrade head`` (``alembic.ini`` at the root) migrates the store named by
``-x store=LOCATION`` or by ``WORLDCTL_STORE``: a store folder or a PostgreSQL URL, as
every ``worldctl`` command takes it.
"""

from __future__ import annotations

import os
from pathlib import Path

from alembic import context

from worldstore.open import STORE_DB
from worldstore.schema import metadata
from worldstore.sqlstore import create_engine_for


def _store_url() -> str:
    location = context.get_x_argument(as_dictionary=True).get("store") or os.environ.get(
        "WORLDCTL_STORE")
    if not location:
        raise SystemExit("error: name the store: alembic -x store=FOLDER_OR_URL upgrade head "
                         "(or set WORLDCTL_STORE)")
    if location.startswith(("postgresql://", "postgresql+psycopg://", "postgres://")):
        return location
    Path(location).mkdir(parents=True, exist_ok=True)
    return str(Path(location) / STORE_DB)


def _run(connection: object) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    context.run_migrations()


given = context.config.attributes.get("connection")
if given is not None:
    _run(given)
else:
    engine = create_engine_for(_store_url())
    try:
        with engine.execution_options(worldstore_write=True).begin() as conn:
            _run(conn)
    finally:
        engine.dispose()
