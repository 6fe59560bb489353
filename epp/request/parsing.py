"""Request parsing: the API kind from the path, the model and the prompt content from the body.

The prompt text is what prefix-cache plugins hash, so its construction is part of the routing contract:
- chat/completions: the JSON of `messages` (orjson, compact), tools appended when present;
- completions: `prompt` (a string, or the JSON of a list);
- embeddings: `input`;
- responses: `instructions` + JSON of `tools` + `input`;
- Anthropic messages: JSON of `system` + JSON of `tools` + JSON of `messages`;
- conversations: the JSON of `items`.
For chat, responses, Anthropic messages and conversations whose body holds a media part (`ParsedBody.media`), each
long inline payload of a media part (a data URL's, or inline `data` / `file_data`) in a member's JSON is replaced by
its identity padded to a nominal 256 tokens (epp.tokenize.media.mask_media): the same media with the same text share
blocks, different media diverge at the item, and a large image neither fills the hashed blocks nor counts as its
base64 length. A string outside a media part (a text quoting a data URL) is text, masked nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from epp.tokenize import holds_media, mask_media
from scheduling.types import ApiKind, ErrorCode, SchedulingError

PATH_HEADERS = (":path", "x-original-path", "x-forwarded-path")

_SUFFIXES: tuple[tuple[str, ApiKind], ...] = (
    ("/chat/completions", ApiKind.CHAT),
    ("/completions", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
    ("/responses", ApiKind.RESPONSES),
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/messages", ApiKind.MESSAGES),
)


def api_kind(headers: Mapping[str, str]) -> ApiKind:
    for name in PATH_HEADERS:
        path = headers.get(name)
        if path:
            path = path.split("?", 1)[0].rstrip("/")
            for suffix, kind in _SUFFIXES:
                if path.endswith(suffix):
                    return kind
            return ApiKind.OTHER
    return ApiKind.OTHER


MEDIA_KINDS = frozenset({ApiKind.CHAT, ApiKind.RESPONSES, ApiKind.MESSAGES, ApiKind.CONVERSATIONS})
UNTYPED_CHECK = 4096  # bytes of a body searched for a "type" key before the media walk


@dataclass(slots=True)
class ParsedBody:
    kind: ApiKind
    body: dict[str, Any]
    model: str
    prompt: str
    media: bool = False  # the body holds a media part (its inline payloads masked in `prompt`)


def _bad(msg: str) -> SchedulingError:
    return SchedulingError(ErrorCode.BAD_REQUEST, msg)


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _nonempty(value: object) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def parse_body(kind: ApiKind, raw: bytes | memoryview) -> ParsedBody:
    """Parse and validate a request body; raise SchedulingError(BadRequest) with a clear message."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise _bad(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise _bad(f"request body must be a JSON object, got {type(body).__name__}")
    # A short body with no "type" key spelt out (a letter can hide in a \u escape) holds no media part: two searches
    # cost less than the walk there (and more than it over a long body, whose walk reads no string).
    untyped = isinstance(raw, bytes) and len(raw) <= UNTYPED_CHECK and b'"type"' not in raw and b"\\u" not in raw
    return validate(kind, body, untyped=untyped)


def validate(kind: ApiKind, body: dict[str, Any], texts: Mapping[str, str] | None = None, *,
             untyped: bool = False) -> ParsedBody:
    """Check a parsed body and build its prompt. `texts`: the canonical JSON (orjson.dumps) of some members,
    already made (epp/request/streaming.py reads them as the body streams in); `untyped`: no member of the body is
    named "type" (so it holds no media part)."""
    model = body.get("model")
    if model is None or model == "":
        raise _bad("model not found in request body")
    if not isinstance(model, str):
        raise _bad("'model' must be a string")
    media = kind in MEDIA_KINDS and not untyped and holds_media(body)  # a text-only body is never searched
    prompt = _extract_prompt(kind, body, texts or {}, media)
    return ParsedBody(kind, body, model, prompt, media)


def _extract_prompt(kind: ApiKind, body: dict[str, Any], texts: Mapping[str, str], media: bool = False) -> str:
    """The prompt; with `media`, each member's JSON with the inline payloads of its media parts masked."""
    def _dumps(name: str) -> str:
        known = texts.get(name)
        text = known if known is not None else _json(body[name])
        return mask_media(text) if media else text

    def _text(name: str) -> str:
        value = body[name]
        return value if isinstance(value, str) else _dumps(name)

    if kind is ApiKind.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("chat completions need at least 1 message in 'messages'")
        text = _dumps("messages")
        if body.get("tools"):
            text += _dumps("tools")
        return text
    if kind is ApiKind.COMPLETIONS:
        prompt = body.get("prompt")
        if not _nonempty(prompt):
            raise _bad("completions need a 'prompt'")
        return _text("prompt")
    if kind is ApiKind.EMBEDDINGS:
        inp = body.get("input")
        if not _nonempty(inp):
            raise _bad("embeddings need an 'input'")
        return _text("input")
    if kind is ApiKind.RESPONSES:
        inp = body.get("input")
        if not _nonempty(inp):
            raise _bad("responses need an 'input'")
        parts = []
        if body.get("instructions"):
            parts.append(_text("instructions"))
        if body.get("tools"):
            parts.append(_dumps("tools"))
        parts.append(_text("input"))
        return "".join(parts)
    if kind is ApiKind.CONVERSATIONS:
        items = body.get("items")
        if not isinstance(items, list) or not items:
            raise _bad("conversations need 'items'")
        return _dumps("items")
    if kind is ApiKind.MESSAGES:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("messages need at least 1 message in 'messages'")
        parts = []
        if body.get("system"):
            parts.append(_text("system"))
        if body.get("tools"):
            parts.append(_dumps("tools"))
        parts.append(_dumps("messages"))
        return "".join(parts)
    return ""


def set_model(raw_body: dict[str, Any], model: str) -> bytes:
    """Re-serialize the body with `model` replaced (model rewrite)."""
    new = dict(raw_body)
    new["model"] = model
    return orjson.dumps(new)
