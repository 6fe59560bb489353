"""The sans-IO ext_proc protocol machine (see `epp.protocol.machine` for the theory of operation)."""

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

__all__ = [
    "CHUNK_LIMIT", "KINDS", "RESPONSE_TABLE", "RULES", "TABLE", "BodyMode", "Decision", "Exchange", "Outcome",
    "Phase", "RequestMachine", "ResponsePhase", "Rule", "header_mutation", "immediate", "read_headers",
    "read_metadata", "streamed_chunks", "struct_to_dict",
]
