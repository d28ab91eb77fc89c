"""The tests' entry point to the registry: discovered once, as the command line does, and handed to what a test
builds (nothing in kv_cache reads a table as a global)."""

from kv_cache.run.registry import discover

REGISTRY = discover()
SECTIONS = REGISTRY.sections()
ENGINES = REGISTRY.engines
POLICIES = REGISTRY.policies
