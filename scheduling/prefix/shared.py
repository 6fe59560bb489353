"""How plugins ask for the approximate prefix data, and the interface they read it through.

The data is keyed by block size: `DataKey("approx-prefix", blockSizeTokens)`. Its one writer is the
`approx-prefix-cache-producer` (scheduling/plugins/producers/approx_prefix.py), declared in the config or created
by the loader when a plugin that produces it (prefix-cache-scorer, estimated-latency-scorer) is present. Every
prefix-aware plugin reads it through `prefix_data(self)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol, cast

from scheduling.api import SchedulingContext
from scheduling.framework.data import DataKey, DataRequest
from scheduling.framework.plugin import P, Plugin, Producer, State
from scheduling.prefix.index import PrefixIndex

APPROX_PREFIX = "approx-prefix"

# Producer parameters a requesting plugin may also carry (GIE puts them on the scorer): plugin param -> producer.
PREFIX_FIELDS: dict[str, str] = {
    "blockSizeTokens": "blockSizeTokens",
    "maxPrefixBlocksToMatch": "maxPrefixBlocksToMatch",
    "lruCapacityPerServer": "lruCapacityPerServer",
    "autoTuneCapacity": "autoTune",
    "autoTune": "autoTune",
    "forgetAfterSeconds": "forgetAfterSeconds",
}

_HINT = (
    "Add a prefix-cache-scorer (or an approx-prefix-cache-producer) with the same blockSizeTokens, or give this "
    "plugin the blockSizeTokens of the one that is there."
)


class PrefixData(Protocol):
    """What readers see of the producer."""

    index: PrefixIndex
    block_tokens: int
    max_blocks: int

    def matches(self, ctx: SchedulingContext, state: State) -> tuple[dict[str, int], int]:
        """(endpoint key -> consecutive matched blocks from the start, total prompt blocks), once per decision."""
        ...


def approx_prefix_request(plugin: Plugin[Any], *, produces: bool) -> DataRequest:
    """The request of a plugin whose Params carry `blockSizeTokens` (and maybe other producer parameters)."""
    p = plugin.params
    given = {
        PREFIX_FIELDS[name]: getattr(p, name) for name in plugin.given_params if name in PREFIX_FIELDS
    }
    block = getattr(p, "blockSizeTokens", 16)
    return DataRequest(DataKey(APPROX_PREFIX, block), given, produces, _HINT)


class PrefixReader(Plugin[P]):
    """Mixin for plugins that read the approximate prefix data: put it first in the bases
    (`class X(PrefixReader, Scorer)`). `produces_prefix` marks the plugins whose presence produces the data."""

    produces_prefix: ClassVar[bool] = False
    prefix: PrefixData

    def data_requests(self) -> Sequence[DataRequest]:
        return (approx_prefix_request(self, produces=self.produces_prefix),)

    def bind_data(self, key: DataKey, producer: Producer[Any]) -> None:
        super().bind_data(key, producer)
        if key.name == APPROX_PREFIX:
            self.prefix = cast(PrefixData, producer)  # the loader binds this key to the approximate producer
