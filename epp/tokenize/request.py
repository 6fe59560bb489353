"""What a request asks the model to read, in the shape a tokenizer (or vLLM's /tokenize) takes. Pure.

`tokenize_input(kind, body, model, base_model, prompt_text)` turns a parsed request body into a
`TokenizeInput`:

- chat/completions: ``messages`` (and ``tools``, ``add_generation_prompt``, ``continue_final_message``), as vLLM
  renders them through the chat template;
- completions / embeddings: ``prompt`` / ``input`` as text; a list of token ids (or a list holding one such list)
  is already tokens (`prompt_ids`);
- responses: ``instructions`` becomes a system message, a string ``input`` a user message, a list ``input`` its
  message items;
- Anthropic messages: ``system`` becomes a system message, content blocks their text.

Message content given as a list of parts is flattened to its parts joined by newlines (vLLM's "string" content
format, what most chat templates expect): a text part as its text, a media part (image, audio, video, file) as its
marker ``<|media:<identity>|>`` (epp.tokenize.media), other parts dropped. The engine puts placeholder tokens and
its own hash of the media there; Pointsman cannot reproduce either, so the marker's tokens make the keys from the
block holding the item on Pointsman's own: no hit is predicted from KV events past the first media item, and the
same media with the same text share keys (speculative entries) while different media do not.
`approx_text` is Pointsman's own prompt text (epp.request.parsing), used by the character approximation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from epp.tokenize.media import media_marker
from scheduling.types import ApiKind


@dataclass(frozen=True, slots=True)
class TokenizeInput:
    model: str  # the model whose tokenizer applies (the base model of a LoRA adapter)
    request_model: str  # the model name the engine serves the request under
    prompt: str | None = None
    messages: tuple[Mapping[str, Any], ...] | None = None
    tools: tuple[Any, ...] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    prompt_ids: tuple[int, ...] | None = None
    approx_text: str = ""

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


_TEXT_PARTS = ("text", "input_text", "output_text")


def flatten_content(content: object) -> object:
    """A list of content parts → their texts and media markers joined by newlines; anything else unchanged."""
    if not isinstance(content, list):
        return content
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and part.get("type", "text") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif (marker := media_marker(part)) is not None:
            texts.append(marker)
    return "\n".join(texts)


def _message(m: object) -> dict[str, Any] | None:
    if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
        return None
    out = dict(m)
    if "content" in out:
        out["content"] = flatten_content(out["content"])
    return out


def _messages(raw: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list):
        return ()
    return tuple(m for m in (_message(x) for x in raw) if m is not None)


def _ids(value: object) -> tuple[int, ...] | None:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    if isinstance(value, list) and value and all(type(t) is int for t in value):  # noqa: E721
        return tuple(value)
    return None


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    return None


def tokenize_input(kind: ApiKind, body: Mapping[str, Any], model: str, base_model: str | None = None,
                   prompt_text: str = "") -> TokenizeInput:
    base = base_model or model
    common: dict[str, Any] = {"model": base, "request_model": model, "approx_text": prompt_text}
    if kind is ApiKind.CHAT:
        tools = body.get("tools")
        return TokenizeInput(
            messages=_messages(body.get("messages")),
            tools=tuple(tools) if isinstance(tools, list) and tools else None,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
            **common,
        )
    if kind in (ApiKind.COMPLETIONS, ApiKind.EMBEDDINGS):
        value = body.get("prompt" if kind is ApiKind.COMPLETIONS else "input")
        ids = _ids(value)
        if ids is not None:
            return TokenizeInput(prompt_ids=ids, **common)
        return TokenizeInput(prompt=_text(value), **common)
    if kind is ApiKind.RESPONSES:
        msgs: list[dict[str, Any]] = []
        if isinstance(body.get("instructions"), str):
            msgs.append({"role": "system", "content": body["instructions"]})
        inp = body.get("input")
        if isinstance(inp, str):
            msgs.append({"role": "user", "content": inp})
        else:
            msgs.extend(_messages(inp))
        return TokenizeInput(messages=tuple(msgs), **common)
    if kind is ApiKind.MESSAGES:
        msgs = []
        system = flatten_content(body.get("system"))
        if isinstance(system, str) and system:
            msgs.append({"role": "system", "content": system})
        msgs.extend(_messages(body.get("messages")))
        return TokenizeInput(messages=tuple(msgs), **common)
    return TokenizeInput(**common)
