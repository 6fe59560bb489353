"""The precise index's scoring walk (scheduling.prefix.precise, whose docstring gives the rule): a request's keys
against the holders table, each endpoint's best rank with its blocks by source and their weighted score. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from scheduling.prefix.precise_holders import Holders
from scheduling.prefix.precise_layout import EndpointMatch, walk


class Matcher:
    def __init__(self, holders: Holders, gpu_weight: float, cpu_weight: float) -> None:
        self.holders = holders
        self.gpu_weight = gpu_weight  # GPU and speculative blocks
        self.cpu_weight = cpu_weight

    def match(self, keys: Sequence[int]) -> dict[str, EndpointMatch]:
        """Endpoint → its best rank's longest consecutive matched prefix (endpoints matching nothing omitted)."""
        holders = self.holders
        low = holders.low
        if not keys or not low:
            return {}
        ends, extra = walk(holders.map, low, keys)
        out: dict[str, EndpointMatch] = {}
        gw, cw = self.gpu_weight, self.cpu_weight
        slots = holders.slots
        for s, blocks in ends.items():
            if not blocks:
                continue
            slot = slots[s]
            if slot is None:
                continue
            cpu, spec = extra.get(s, (0, 0))
            gpu = blocks - cpu - spec
            res = EndpointMatch(blocks, (gpu + spec) * gw + cpu * cw, gpu, cpu, spec, slot.rank, slot.state)
            best = out.get(slot.endpoint)
            if best is None or (res.score, res.blocks, -res.rank) > (best.score, best.blocks, -best.rank):
                out[slot.endpoint] = res
        return out
