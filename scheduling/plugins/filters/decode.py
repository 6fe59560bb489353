"""decode-filter: keep endpoints whose role label (llm-d.ai/role or mif.moreh.io/role) is one of decode,
prefill-decode, both, encode-prefill-decode or e2e, plus endpoints with no role label.

    keep(e) = role(e) is None or role(e) ∈ DECODE_ROLES
"""

from __future__ import annotations

from scheduling.framework import Filter, register
from scheduling.plugins.filters._roles import is_decode


@register("decode-filter")
class DecodeFilter(Filter):
    def filter(self, ctx, candidates, state):
        return [e for e in candidates if is_decode(e)]
