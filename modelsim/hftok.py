"""modelsim with a real tokenizer (``--tokenizer DIR``): every server tokenizes requests with a Hugging Face
``tokenizer.json`` and the chat template of ``tokenizer_config.json``, as vLLM does, so the token ids it caches,
publishes in BlockStored and returns from ``/tokenize`` are those of that tokenizer.

- chat, Anthropic messages and responses requests: the messages (Anthropic ``system`` and responses
  ``instructions`` become a system message; content parts are flattened to their text) rendered through the
  chat template with ``add_generation_prompt`` (default true), encoded without special tokens;
- completions and embeddings: the prompt encoded with special tokens (token-id prompts are used as is).

The template rendering and the request-to-messages conversion are Pointsman's (epp.tokenize), imported only in
this mode. Without ``--tokenizer`` modelsim keeps its byte tokenizer (modelsim.tokenizer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelsim import tokenizer as tk

_KINDS = {tk.API_CHAT: "CHAT", tk.API_COMPLETIONS: "COMPLETIONS", tk.API_MESSAGES: "MESSAGES",
          tk.API_RESPONSES: "RESPONSES", tk.API_EMBEDDINGS: "EMBEDDINGS"}


class HFTokenizer:
    def __init__(self, path: str) -> None:
        from epp.tokenize.local import LocalTokenizer

        self.local = LocalTokenizer.from_dir(path)

    def request_tokens(self, api: str, body: Mapping[str, Any]) -> list[int]:
        """Token ids of a request body (raises ValueError for an unknown api or a template error)."""
        from epp.tokenize.request import tokenize_input
        from scheduling.types import ApiKind

        kind = _KINDS.get(api)
        if kind is None:
            raise ValueError(f"unknown api {api!r}")
        req = tokenize_input(ApiKind[kind], body, str(body.get("model") or ""))
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        if req.messages is not None:
            return self.local.encode_chat(req.messages, req.add_generation_prompt and not req.continue_final_message,
                                          req.tools, req.continue_final_message)
        if req.prompt is not None:
            return self.local.encode_prompt(req.prompt)
        return []

    def tokenize_endpoint(self, body: Mapping[str, Any]) -> list[int]:
        """vLLM's /tokenize: chat adds no special tokens beyond the template's, a prompt adds them (both unless
        ``add_special_tokens`` says otherwise)."""
        if "messages" in body:
            from epp.tokenize.request import tokenize_input
            from scheduling.types import ApiKind

            req = tokenize_input(ApiKind.CHAT, body, str(body.get("model") or ""))
            text = self.local.render_chat(req.messages or (), req.add_generation_prompt, req.tools,
                                          req.continue_final_message)
            return self.local.encode_prompt(text, bool(body.get("add_special_tokens", False)))
        return self.local.encode_prompt(body["prompt"], bool(body.get("add_special_tokens", True)))

    def decode(self, tokens: list[int]) -> str:
        return self.local.tokenizer.decode(tokens, skip_special_tokens=False)
