"""llm/: the one LLM client (``worldllm.client``) that agents, judges and synthesis share."""
