"""encode-filter: keep endpoints whose role label is one of encode, encode-prefill or encode-prefill-decode.

keep(e) = role(e) ∈ {encode, encode-prefill, encode-prefill-decode}
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.plugins.filters._roles import is_encode
from scheduling.types import Endpoint


@register("encode-filter")
class EncodeFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        return [e for e in candidates if is_encode(e)]
