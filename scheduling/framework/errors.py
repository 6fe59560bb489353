"""Configuration errors: every message names the source file, the field path and what was expected."""

from __future__ import annotations


class ConfigError(ValueError):
    """A scheduling configuration that cannot be loaded.

    `str(err)` reads `<source>: <field path>: <what was wrong and what was expected>`.
    """

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source = source
        self.path = path
        self.message = message
        super().__init__(f"{source}: {path}: {message}" if path else f"{source}: {message}")


def join_path(base: str, key: str | int) -> str:
    """`plugins` + 0 -> `plugins[0]`; `spec` + `plugins` -> `spec.plugins`."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    return f"{base}.{key}" if base else key
