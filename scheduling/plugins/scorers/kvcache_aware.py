"""kvcache-aware (Kthena): how much of the prompt's KV cache an endpoint holds, in blocks of tokens.

    blocks     = the prompt in blocks of blockSizeToHash tokens (16), at most maxBlocksToMatch (128)
    matched(e) = consecutive blocks from the start that e holds
    score(e)   = matched(e) / blocks        (0 for every endpoint when nothing matches or the prompt is empty)

Kthena learns which blocks a pod holds from the engines' KV events (through Redis, on the engine's own tokens).
With the shell's precise index (KV events, docs/kv-events.md) so does Pointsman: matched(e) comes from e's events
(weighted by medium, with Pointsman's speculative picks) where e's index is live, and from the approximate index
elsewhere, where a token is estimated as 4 characters (16 tokens = 64 characters, so by default it shares one
index with prefix-cache). The request is tokenized by the shell (token-producer); Kthena's vllmTokenizerPort /
sglangTokenizerPort are accepted (the shell asks the engine's own /tokenize on its serving port).
"""

from __future__ import annotations

from scheduling.framework import register
from scheduling.plugins.scorers._kthena_prefix import KthenaPrefix, TokenParams
from scheduling.types import CHARS_PER_TOKEN


@register("kvcache-aware")
class KthenaKVCacheAware(KthenaPrefix):
    Params = TokenParams
    chars_per_unit = CHARS_PER_TOKEN
