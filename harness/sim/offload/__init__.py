"""A CPU tier of KV memory: vLLM's native offloading, mirrored step for step (README.md, "A CPU tier")."""
