"""The sans-IO ext_proc protocol machine (see `epp.protocol.machine` for the theory of operation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

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
    from epp.protocol.rawbody import RawBody, RawReply, read_request_body
    from epp.protocol.response import RESPONSE_TABLE, ResponsePhase

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562).
_LAZY = {
    "BodyMode": "contract", "Decision": "contract", "Exchange": "contract", "Outcome": "contract",
    "RULES": "contract", "Rule": "contract",
    "KINDS": "machine", "Phase": "machine", "RequestMachine": "machine", "TABLE": "machine",
    "CHUNK_LIMIT": "messages", "header_mutation": "messages", "immediate": "messages", "read_headers": "messages",
    "read_metadata": "messages", "streamed_chunks": "messages", "struct_to_dict": "messages",
    "RawBody": "rawbody", "RawReply": "rawbody", "read_request_body": "rawbody",
    "RESPONSE_TABLE": "response", "ResponsePhase": "response",
}

__all__ = ["BodyMode", "CHUNK_LIMIT", "Decision", "Exchange", "KINDS", "Outcome", "Phase", "RESPONSE_TABLE", "RULES",
           "RawBody", "RawReply", "RequestMachine", "ResponsePhase", "Rule", "TABLE", "header_mutation", "immediate", "read_headers",
           "read_metadata", "read_request_body", "streamed_chunks", "struct_to_dict"]


__getattr__ = lazy_exports(__name__, _LAZY)
