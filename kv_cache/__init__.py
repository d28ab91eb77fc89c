"""kv-cache-bench: an honest, block-level load generator for LLM KV-cache storage."""

__version__ = "0.1.0"
