"""Role label values accepted by the role filters (llm-d `llm-d.ai/role`, Heimdall `mif.moreh.io/role`)."""

from __future__ import annotations

from scheduling.types import Endpoint

# Heimdall's "e2e" worker does both prefill and decode.
DECODE_ROLES = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode", "e2e"})
PREFILL_ROLES = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode", "e2e"}
)
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


def is_decode(e: Endpoint) -> bool:
    role = e.role
    return role is None or role in DECODE_ROLES


def is_prefill(e: Endpoint) -> bool:
    return e.role in PREFILL_ROLES


def is_encode(e: Endpoint) -> bool:
    return e.role in ENCODE_ROLES
