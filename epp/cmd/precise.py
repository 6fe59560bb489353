"""`epp serve`'s precise prefix routing: the precise index with its KV-event subscriptions (following the
datastore), and request tokenization (docs/kv-events.md). Both are the shell's: they outlive scheduling-config
reloads. ZMQ (the 'precise' extra) is imported only once an endpoint publishes KV events."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.fleet.kvevents import PreciseService
from epp.tokenize import tokens_from_settings

if TYPE_CHECKING:
    from epp.cmd.components import Components


async def start_precise(app: Components) -> None:
    registry = app.metrics.registry if app.metrics is not None else None
    precise = PreciseService.from_settings(app.settings.kvevents, app.datastore, registry)
    precise.attach()
    app.precise = app.runner.own("KV-event subscriptions", precise)
    app.tokens = tokens_from_settings(app.settings.tokenize, registry)
    engine = app.tokens.tokenizer.engine
    if engine is not None:
        app.runner.own("engine tokenizer", engine)


__all__ = ["start_precise"]
