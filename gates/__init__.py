"""Grading: tasks, the sandboxed verifier runtime, rewards, agents, judges, the five quality
gates and world-day validation. ``gates.contract`` holds the types they all share."""
