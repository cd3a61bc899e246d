"""synth/: world and task synthesis, and its QA (world-day validation, the day reviewer)."""
