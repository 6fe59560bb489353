"""The runner of `epp serve`'s components: started in order, closed in reverse.

A component is anything with `async close()` or `async stop()` (a file watcher, a discovery, the scraper, the bus,
a server...). Each start step (epp/cmd/app.py: `STEPS`) starts its components from the settings and hands them to
the runner, which closes them in the reverse order on shutdown; one that fails to close is logged and the others
still close.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, runtime_checkable

log = logging.getLogger("epp")

Close = Callable[[], Awaitable[object]]


class Closeable(Protocol):
    async def close(self) -> Any: ...


@runtime_checkable
class Stoppable(Protocol):
    async def stop(self) -> Any: ...


C = TypeVar("C", bound="Closeable | Stoppable")


class Runner:
    def __init__(self) -> None:
        self.components: list[tuple[str, Close]] = []  # in start order

    def add(self, name: str, close: Close) -> None:
        """Register how to close a started component (or any resource that needs closing)."""
        self.components.append((name, close))

    def own(self, name: str, component: C) -> C:
        """Register a started component by its `close()` (else its `stop()`); returns it."""
        close = getattr(component, "close", None)
        if not inspect.iscoroutinefunction(close):
            if not isinstance(component, Stoppable):
                raise TypeError(f"{name}: a component needs an async close() or stop()")
            close = component.stop
        self.add(name, close)
        return component

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.components]

    async def close(self) -> None:
        """Close every component, the last started first."""
        while self.components:
            name, close = self.components.pop()
            try:
                await close()
            except Exception:  # one component's failure never keeps the others open
                log.debug("closing %s failed", name, exc_info=True)


__all__ = ["Closeable", "Runner", "Stoppable"]
