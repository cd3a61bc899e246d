"""Domain packs: one folder per domain (its world logs, tasks and splits), loaded by name."""
