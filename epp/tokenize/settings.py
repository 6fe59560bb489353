"""`epp serve`'s tokenization flags, parsed once (for configs that read token ids; docs/kv-events.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from epp.argtypes import parse_bool
from epp.extras import check


def add_flags(g: argparse._ActionsContainer) -> None:
    """The "tokenization" group."""
    g.add_argument("--tokenizers-dir", default=None,
                   help="local Hugging Face tokenizers: DIR/<model name>/tokenizer.json (+ tokenizer_config.json "
                        "with the chat template); tried first")
    g.add_argument("--tokenize-engine", type=parse_bool, default=True,
                   help="ask the engine's POST /tokenize when no local tokenizer fits (true)")
    g.add_argument("--tokenize-timeout", type=float, default=0.5,
                   help="seconds one /tokenize call may take before the approximation is used (0.5)")
    g.add_argument("--tokenize-cache", type=int, default=4096,
                   help="engine /tokenize results kept (LRU, also bounded to 4M tokens) (4096)")


@dataclass(frozen=True)
class TokenizeSettings:
    tokenizers_dir: str | None = None  # local tokenizers, tried first ('precise' extra)
    engine: bool = True  # ask the engine's POST /tokenize when no local tokenizer fits
    timeout: float = 0.5  # seconds one /tokenize call may take
    cache_entries: int = 4096  # engine /tokenize results kept

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TokenizeSettings:
        if ns.tokenizers_dir:
            check("precise", "--tokenizers-dir", ("tokenizers", "jinja2"))
        if ns.tokenize_engine:
            if ns.tokenize_timeout <= 0:
                raise ValueError(f"--tokenize-timeout: expected a positive number of seconds, got {ns.tokenize_timeout}")
            if ns.tokenize_cache < 1:
                raise ValueError(f"--tokenize-cache: expected a positive number of entries, got {ns.tokenize_cache}")
        return cls(tokenizers_dir=ns.tokenizers_dir or None, engine=ns.tokenize_engine, timeout=ns.tokenize_timeout,
                   cache_entries=ns.tokenize_cache)


__all__ = ["TokenizeSettings", "add_flags"]
