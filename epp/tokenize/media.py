"""Images, audio, video and files in a request: a stable identity for each media item. Pure.

An engine sees a media item as placeholder tokens plus a hash of the item's processed content (vLLM's mm_hash).
Pointsman has neither the model's processor nor the pixels, so it gives each item an identity from what the
request says, and lets that identity stand where the item stands in the prompt:

- the **reference** of an item is its URL (``http(s)://…``), the payload of a data URL or inline data (base64 as
  sent, not decoded: the same bytes sent the same way have the same reference), a file id, or the client's own
  ``uuid`` for the item (vLLM's ``multi_modal_uuids``: the client vouches that equal uuids are equal media);
- its **identity** is ``xxh3_128`` of the kind and the reference (32 hex digits).

Media parts read (`media_ref`):

- OpenAI chat: ``image_url`` (``{"url"}`` or a string), ``input_audio`` (``{"data", "format"}``), ``video_url``,
  ``audio_url``, ``file`` (``{"file_data"}``, ``{"file_id"}``);
- Anthropic messages: ``image`` and ``document`` blocks (``source`` of type ``base64``, ``url``, ``file`` or
  ``text``);
- Responses: ``input_image`` (``image_url`` or ``file_id``), ``input_file`` (``file_data``, ``file_url``,
  ``file_id``), ``input_audio``.

Two uses:

- `media_marker(part)`: the text the precise path tokenizes in the item's place (``<|media:<identity>|>``). Its
  tokens are never the engine's placeholder tokens, so keys from the block holding the item on never equal an
  engine's (never a hit predicted from KV events past the first media item), and they carry the identity, so
  Pointsman's own speculative entries separate different media and join equal ones.
- `mask_media(text)`: the approximate path hashes the prompt's JSON text. A long inline payload (at least
  `INLINE_MIN` characters without an escape: a data URL's, or the value of ``data`` / ``file_data``) is replaced by
  ``#media:<identity>``, padded with ``~`` to `MEDIA_TOKENS` × 4 characters: equal payloads still give equal
  text, different ones still differ at the item, but a megabyte of base64 no longer fills the hashed blocks (which
  stop at ``max_blocks``) nor stands for 250,000 tokens; the item weighs a nominal 256 tokens instead (the engine
  gives an image its model's placeholder count: a few hundred to a few thousand tokens, which Pointsman cannot
  know without the model's processor), so a shared image counts in the prefix about as a shared image does in the
  engine's cache. An item sent by URL weighs its URL text. A whole body is masked only when it holds a media part
  (`holds_media`, a walk over its structure); a text without ``"data:``, ``"data":"`` or ``"file_data":"`` is
  returned as is (three substring searches); else each payload is found by substring searches and hashed once (no per-character Python work); the body itself is bounded by
  the ext_proc body limit (413 past it). URLs are short and stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from scheduling.types import CHARS_PER_TOKEN

INLINE_MIN = 256  # characters from which an inline payload is masked
MEDIA_TOKENS = 256  # what a masked item weighs in the prompt text: a nominal placeholder count (see above)
_MEDIA_CHARS = MEDIA_TOKENS * CHARS_PER_TOKEN

# Where an inline payload starts: a JSON string opening with "data:" (its payload after the first comma), or the
# value of "data" / "file_data". In canonical JSON a quote inside a string is escaped, so each trigger is structure.
_TRIGGERS = ('"data:', '"data":"', '"file_data":"')
_HEAD_MAX = 200  # characters of a data URL before its comma ("data:image/png;base64")


def identity(kind: str, ref: str) -> str:
    """The identity of a media item of `kind` with reference `ref` (32 hex digits)."""
    return xxhash.xxh3_128_hexdigest(kind.encode() + b"\0" + ref.encode("utf-8", "surrogatepass"))


def _str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None


def _url(v: object) -> str | None:
    """A URL given as a string or as {"url": ...}."""
    if isinstance(v, Mapping):
        v = v.get("url")
    return _str(v)


def _source(v: object) -> str | None:
    """An Anthropic block's source: base64 data, a URL, a file id, or inline text."""
    if not isinstance(v, Mapping):
        return None
    return _str(v.get("data")) or _str(v.get("url")) or _str(v.get("file_id")) or _str(v.get("content"))


def _file(v: object) -> str | None:
    if not isinstance(v, Mapping):
        return None
    return _str(v.get("file_data")) or _str(v.get("file_url")) or _str(v.get("file_id"))


def _audio(v: object) -> str | None:
    return _str(v.get("data")) if isinstance(v, Mapping) else None


_REFS: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
    "image_url": lambda p: _url(p.get("image_url")),
    "video_url": lambda p: _url(p.get("video_url")),
    "audio_url": lambda p: _url(p.get("audio_url")),
    "input_audio": lambda p: _audio(p.get("input_audio")),
    "file": lambda p: _file(p.get("file")),
    "image": lambda p: _source(p.get("source")),
    "document": lambda p: _source(p.get("source")),
    "input_image": lambda p: _str(p.get("image_url")) or _str(p.get("file_id")),
    "input_file": _file,
}


def media_ref(part: object) -> tuple[str, str] | None:
    """(kind, reference) of a media content part; None for text and anything else."""
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if not isinstance(kind, str):
        return None
    read = _REFS.get(kind)
    if read is None:
        return None
    uuid = _str(part.get("uuid"))
    if uuid is not None:
        return kind, "uuid:" + uuid
    ref = read(part)
    return (kind, ref) if ref is not None else (kind, "")


def holds_media(value: object) -> bool:
    """Whether a parsed body holds a media part (a dict whose "type" is a kind `media_ref` reads), found in the
    structure, not the text: a walk over the body's lists and dicts, which never reads a string, so a long text-only
    prompt costs nothing here (a substring search over 256 KB of it costs about 140 µs, `mask_media` three)."""
    stack: list[object] = [value]
    push, pop = stack.append, stack.pop
    while stack:
        v = pop()
        if isinstance(v, dict):
            if v.get("type") in _REFS:
                return True
            for x in v.values():
                if isinstance(x, (dict, list)):
                    push(x)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, (dict, list)):
                    push(x)
    return False


def media_marker(part: object) -> str | None:
    """The text standing for a media part in the tokenized prompt; None when `part` is not media."""
    ref = media_ref(part)
    if ref is None:
        return None
    return f"<|media:{identity(*ref)}|>"


def _mask(text: str, trigger: str, partial: bool) -> str:
    """`text` with every long payload after `trigger` masked; with `partial`, cut before a string still open."""
    out: list[str] = []
    pos = 0
    url = trigger == '"data:'
    while (i := text.find(trigger, pos)) >= 0:
        opening = i if url else i + len(trigger) - 1  # the payload's string opens here
        start = i + len(trigger)
        if url:
            comma = text.find(",", start, start + _HEAD_MAX)
            head = text[start:comma] if comma >= 0 else ""
            if comma < 0 or '"' in head or "\\" in head:
                if partial and comma < 0 and text.find('"', start) < 0:
                    out.append(text[pos:opening])
                    return "".join(out)
                pos = start
                continue
            start = comma + 1
        end = text.find('"', start)
        if end < 0:  # the string has not ended: the whole text if complete, else cut here
            if partial:
                out.append(text[pos:opening])
                return "".join(out)
            break
        payload = text[start:end]
        if len(payload) >= INLINE_MIN and "\\" not in payload:
            out.append(text[pos:start])
            out.append(f"#media:{identity('inline', payload)}".ljust(_MEDIA_CHARS, "~"))
            pos = end
        else:
            out.append(text[pos:end])
            pos = end
    out.append(text[pos:])
    return "".join(out)


def mask_media(text: str, partial: bool = False) -> str:
    """`text` (JSON) with each long inline payload replaced by its identity (see the module docstring).

    `partial`: the text is the start of a longer one (a body still streaming in); a payload that may still be
    arriving at its end is cut off, so the result is a prefix of the whole text's result."""
    if "data" not in text:  # in every trigger: one search for the common case, a text without media
        return text
    for trigger in _TRIGGERS:
        if trigger in text:
            text = _mask(text, trigger, partial)
    return text
