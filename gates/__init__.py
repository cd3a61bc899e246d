"""Grading: task folders, the sandboxed verifier runtime, rewards, agents, rollouts, judges and
the five quality gates. ``gates.contract`` holds the types they all share."""
