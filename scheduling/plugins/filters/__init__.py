"""Filters plugins: one per module, discovered by scheduling.framework.registry."""
