"""The one thing pyproject.toml cannot say: the store's Alembic environment lives in the
top-level ``migrations/`` folder (where ``alembic upgrade head`` finds it from a checkout,
through ``alembic.ini``), and the wheel carries it inside the store, as
``worldstore.migrations``."""

from setuptools import find_packages, setup

TOP = ["worldstore", "replay", "worldenv", "worldllm", "gates", "packs", "synth", "rl", "eval",
       "worldctl", "awmbridge"]

setup(
    packages=[*find_packages(include=[p for top in TOP for p in (top, f"{top}.*")]),
              "worldstore.migrations", "worldstore.migrations.versions"],
    package_dir={"worldstore.migrations": "migrations",
                 "worldstore.migrations.versions": "migrations/versions"},
)
