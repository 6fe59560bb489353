"""decode-filter: keep endpoints whose role label (llm-d.ai/role or mif.moreh.io/role) is one of decode,
prefill-decode, both, encode-prefill-decode or e2e, plus endpoints with no role label.

    keep(e) = role(e) is None or role(e) ∈ DECODE_ROLES
"""

from __future__ import annotations

from scheduling.api import SchedulingContext
from scheduling.framework import Filter, register
from scheduling.framework.plugin import State
from scheduling.plugins.filters._roles import is_decode
from scheduling.types import Endpoint


@register("decode-filter")
class DecodeFilter(Filter[None]):
    def filter(self, ctx: SchedulingContext, candidates: list[Endpoint], state: State) -> list[Endpoint]:
        return [e for e in candidates if is_decode(e)]
