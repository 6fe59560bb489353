"""token-producer (llm-d): the request's token ids, as the engine will see them, for the plugins that read tokens.

Its presence in the deciding config is what makes the shell tokenize a request before scheduling (a config
without it pays nothing). The shell tries, in order (epp/tokenize, docs/kv-events.md):

    tokens = the prompt itself                       when the request is token ids          source "prompt"
           = the model's local tokenizer + chat template  (--tokenizers-dir)                 source "local"
           = the engine's POST /tokenize             vllm.http, else an endpoint serving    source "engine"
                                                     the model; cached, within vllm.timeout
           = 4 UTF-8 bytes of the prompt text per token                                     source "approx"

and sets `LLMRequest.token_ids` and `token_source` (`estimated_tokens` then counts the real tokens).
Parameters (llm-d's): `modelName` (the tokenizer's model; default: each request's own base model), `vllm.http`
(a fixed engine URL for /tokenize, e.g. a render sidecar), `vllm.timeout` (the call's timeout; default the shell's
--tokenize-timeout). `vllm.mmTimeout` is accepted (Pointsman sends no multimodal content to /tokenize).
It is declared in a config's plugin list, or created by the loader for the plugins that read tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduling.framework import BuildContext, ConfigError, Plugin, Producer, register
from scheduling.framework.data import DataKey
from scheduling.framework.errors import join_path
from scheduling.framework.params import parse_duration
from scheduling.prefix.precise_data import TOKEN_IDS

_VLLM_KEYS = ("http", "timeout", "mmTimeout")


@dataclass(frozen=True)
class Params:
    modelName: str = ""
    vllm: Any = None  # {http: URL, timeout: duration, mmTimeout: duration}


@register("token-producer")
class TokenProducer(Producer[Params]):
    Params = Params

    def setup(self, build: BuildContext) -> None:
        p: Params = self.params
        self.model_name = p.modelName or None
        self.engine_url: str | None = None
        self.timeout: float | None = None
        raw = p.vllm
        if raw is None:
            return
        where = join_path(build.path, "vllm")
        if not isinstance(raw, Mapping):
            raise ConfigError(build.source, where, f"expected a mapping with {', '.join(_VLLM_KEYS)}, got {raw!r}")
        for k in raw:
            if k not in _VLLM_KEYS:
                raise ConfigError(build.source, join_path(where, str(k)),
                                  f"unknown parameter; expected one of {', '.join(_VLLM_KEYS)}")
        url = raw.get("http")
        if url is not None:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ConfigError(build.source, join_path(where, "http"),
                                  f"expected an http:// or https:// base URL, got {url!r}")
            self.engine_url = url.rstrip("/")
        for name in ("timeout", "mmTimeout"):
            if name in raw:
                try:
                    value = parse_duration(raw[name])
                except ValueError as e:
                    raise ConfigError(build.source, join_path(where, name), str(e)) from None
                if value <= 0:
                    raise ConfigError(build.source, join_path(where, name), f"expected a positive duration, "
                                                                            f"got {raw[name]!r}")
                if name == "timeout":
                    self.timeout = value

    def data_key(self) -> DataKey:
        return DataKey(TOKEN_IDS)


def create_token_producer(key: DataKey, params: Mapping[str, object], requesters: list[Plugin[Any]]) -> Producer[Any]:
    """The loader's factory: a token-producer with the defaults (the shell's tokenizers)."""
    first = requesters[0]
    return TokenProducer("token-producer", Params(), BuildContext(source=first.source, path=first.path))
