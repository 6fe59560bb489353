"""prefill-filter: keep endpoints whose role label is one of prefill, encode-prefill, prefill-decode, both,
encode-prefill-decode or e2e. Unlabelled endpoints are dropped.

    keep(e) = role(e) ∈ PREFILL_ROLES
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.plugins.filters._roles import is_prefill
from scheduling.types import Endpoint


@register("prefill-filter")
class PrefillFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        return [e for e in candidates if is_prefill(e)]
