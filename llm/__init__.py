"""llm/: the one LLM client (``llm.client``) that agents, judges and synthesis share."""
