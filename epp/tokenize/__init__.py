"""Tokenize each request as its engine will, for the precise prefix index.

Sources, tried in order (`RequestTokenizer.tokenize`):

1. ``prompt``: the request is already token ids (a completions prompt given as ids) — exact;
2. ``local``: the model's Hugging Face tokenizer (``tokenizer.json`` + the chat template of
   ``tokenizer_config.json``) — exact when it is the engine's tokenizer (epp.tokenize.local);
3. ``engine``: the engine's own ``POST /tokenize`` (vLLM's API), cached, with a timeout and a back-off
   (epp.tokenize.engine) — exact, costs a round trip on a cache miss;
4. ``approx``: the character approximation, 4 UTF-8 bytes of Pointsman's prompt text per token (big-endian,
   NUL-padded; this is exactly modelsim's tokenizer, and only an estimate for a real one).

`TokenizeResult.source` says which one produced the tokens, and `detail` why earlier ones were passed over;
`counts` (and the optional Prometheus counter ``pointsman_tokenize_requests_total{source}``) count them.
`tokenize_nowait` never awaits: it skips the engine (and a local tokenizer not loaded yet).

tokenizer.py holds `RequestTokenizer`; settings.py the flags (standard library only: the CLI reads them).

Public API: `RequestTokenizer`, `TokenizeResult`, `TokenizeInput`, `tokenize_input`, `approx_tokens`,
`LocalTokenizer`, `TokenizerRegistry`, `EngineTokenizer`; media identities (media.py, pure): `media_ref`,
`media_marker`, `mask_media`, `holds_media`, `head_holds_media`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epp.extras import lazy_exports

if TYPE_CHECKING:
    from epp.tokenize.engine import EngineTokenizer
    from epp.tokenize.local import LocalTokenizer, TokenizerLoadError, TokenizerRegistry
    from epp.tokenize.media import head_holds_media, holds_media, mask_media, media_marker, media_ref
    from epp.tokenize.request import TokenizeInput, tokenize_input
    from epp.tokenize.shell import RequestTokens, tokens_from_settings
    from epp.tokenize.tokenizer import SOURCES, RequestTokenizer, TokenizeResult, approx_tokens

# Each name and the module that defines it ("module:name" when renamed), imported on first use (PEP 562): the engine
# client loads aiohttp, and the CLI reads epp.tokenize.settings without it.
_LAZY = {
    "EngineTokenizer": "engine",
    "LocalTokenizer": "local", "TokenizerLoadError": "local", "TokenizerRegistry": "local",
    "head_holds_media": "media", "holds_media": "media", "mask_media": "media", "media_marker": "media",
    "media_ref": "media",
    "TokenizeInput": "request", "tokenize_input": "request",
    "RequestTokens": "shell", "tokens_from_settings": "shell",
    "RequestTokenizer": "tokenizer", "SOURCES": "tokenizer", "TokenizeResult": "tokenizer",
    "approx_tokens": "tokenizer",
}

__all__ = ["EngineTokenizer", "LocalTokenizer", "RequestTokenizer", "RequestTokens", "SOURCES", "TokenizeInput",
           "TokenizeResult", "TokenizerLoadError", "TokenizerRegistry", "approx_tokens", "head_holds_media", "holds_media",
           "mask_media", "media_marker", "media_ref", "tokenize_input", "tokens_from_settings"]


__getattr__ = lazy_exports(__name__, _LAZY)
