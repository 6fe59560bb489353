"""prefill-filter: keep endpoints whose role label is one of prefill, encode-prefill, prefill-decode, both,
encode-prefill-decode or e2e. Unlabelled endpoints are dropped.

    keep(e) = role(e) ∈ PREFILL_ROLES
"""

from __future__ import annotations

from scheduling.framework import Filter, register
from scheduling.plugins.filters._roles import is_prefill


@register("prefill-filter")
class PrefillFilter(Filter):
    def filter(self, ctx, candidates, state):
        return [e for e in candidates if is_prefill(e)]
