"""agent-worlds environments: serve world instances to agents (tools, shell, episodes)."""
