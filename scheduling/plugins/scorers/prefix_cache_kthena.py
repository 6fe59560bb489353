"""prefix-cache (Kthena): how much of the prompt's prefix an endpoint is believed to hold, in blocks of characters.

    blocks     = the prompt in blocks of blockSizeToHash characters (64), at most maxBlocksToMatch (128)
    matched(e) = consecutive blocks from the start that e is believed to hold (the approximate prefix index)
    score(e)   = matched(e) / blocks        (0 for every endpoint when nothing matches or the prompt is empty)

It produces the approximate prefix data (the producer records the prompt's blocks for the chosen endpoint after the
pick). Kthena's maxHashCacheSize (one LRU over all pods) and topKMatches are accepted; Pointsman bounds the index
per endpoint (lruCapacityPerServer) and scores every candidate. With the shell's precise index (KV events) the
matches of endpoints whose index is live come from their events instead (scheduling.prefix.precise_data).
"""

from __future__ import annotations

from scheduling.framework import register
from scheduling.plugins.scorers._kthena_prefix import CharParams, KthenaPrefix


@register("prefix-cache")
class KthenaPrefixCache(KthenaPrefix):
    Params = CharParams
