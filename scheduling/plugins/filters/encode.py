"""encode-filter: keep endpoints whose role label is one of encode, encode-prefill or encode-prefill-decode.

keep(e) = role(e) ∈ {encode, encode-prefill, encode-prefill-decode}
"""

from __future__ import annotations

from scheduling.framework import Filter, register
from scheduling.plugins.filters._roles import is_encode


@register("encode-filter")
class EncodeFilter(Filter):
    def filter(self, ctx, candidates, state):
        return [e for e in candidates if is_encode(e)]
