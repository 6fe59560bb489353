"""The sans-IO ext_proc protocol machine (see `epp.protocol.machine` for the theory of operation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from epp.protocol.contract import RULES, BodyMode, Decision, Exchange, Outcome, Rule
    from epp.protocol.machine import KINDS, TABLE, Phase, RequestMachine
    from epp.protocol.messages import (
        CHUNK_LIMIT,
        header_mutation,
        immediate,
        read_headers,
        read_metadata,
        streamed_chunks,
        struct_to_dict,
    )
    from epp.protocol.response import RESPONSE_TABLE, ResponsePhase

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "BodyMode": "contract", "Decision": "contract", "Exchange": "contract", "Outcome": "contract",
    "RULES": "contract", "Rule": "contract",
    "KINDS": "machine", "Phase": "machine", "RequestMachine": "machine", "TABLE": "machine",
    "CHUNK_LIMIT": "messages", "header_mutation": "messages", "immediate": "messages", "read_headers": "messages",
    "read_metadata": "messages", "streamed_chunks": "messages", "struct_to_dict": "messages",
    "RESPONSE_TABLE": "response", "ResponsePhase": "response",
}

__all__ = ["BodyMode", "CHUNK_LIMIT", "Decision", "Exchange", "KINDS", "Outcome", "Phase", "RESPONSE_TABLE", "RULES",
           "RequestMachine", "ResponsePhase", "Rule", "TABLE", "header_mutation", "immediate", "read_headers",
           "read_metadata", "streamed_chunks", "struct_to_dict"]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    module, _, attr = _LAZY[name].partition(":")
    value = getattr(import_module(f"{__name__}.{module}"), attr or name)
    globals()[name] = value
    return value
