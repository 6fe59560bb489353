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
  `INLINE_MIN` base64 characters: a data URL's, or the value of ``data`` / ``file_data``) is replaced by
  ``#media:<identity>``: equal payloads still give equal text, different ones still differ at the item, but a
  megabyte of base64 no longer fills the hashed blocks (which stop at ``max_blocks``) nor stands for 250,000
  tokens. A text without ``"data:``, ``"data":"`` or ``"file_data":"`` is returned as is (a substring search, about
  a microsecond for 10 KB); else linear in the text (one regular-expression scan, one hash per payload); the body itself is bounded by
  the ext_proc body limit (413 past it). URLs are short and stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import xxhash

INLINE_MIN = 256  # base64 characters from which an inline payload is masked

_B64 = r"[A-Za-z0-9+/=_-]"
# a data URL with a long payload, anywhere; or long inline data as the value of "data" or "file_data"
_INLINE = re.compile(r'"(data:[^",\\]{0,200},)(' + _B64 + "{" + str(INLINE_MIN) + r',})"'
                     r'|("(?:file_)?data":)"(' + _B64 + "{" + str(INLINE_MIN) + r',})"')
_TRIGGERS = ('"data:', '"data":"', '"file_data":"')  # every match holds one: a text without any has none
_OPEN_TAIL = re.compile(r'"(data:[^",\\]{0,200},)?' + _B64 + "*$")


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


_REFS = {
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
    read = _REFS.get(kind) if isinstance(kind, str) else None
    if read is None:
        return None
    uuid = _str(part.get("uuid"))
    if uuid is not None:
        return kind, "uuid:" + uuid
    ref = read(part)
    return (kind, ref) if ref is not None else (kind, "")


def media_marker(part: object) -> str | None:
    """The text standing for a media part in the tokenized prompt; None when `part` is not media."""
    ref = media_ref(part)
    if ref is None:
        return None
    return f"<|media:{identity(*ref)}|>"


def _masked(m: re.Match[str]) -> str:
    if m.group(1) is not None:
        return f'"{m.group(1)}#media:{identity("inline", m.group(2))}"'
    return f'{m.group(3)}"#media:{identity("inline", m.group(4))}"'


def mask_media(text: str, partial: bool = False) -> str:
    """`text` (JSON) with each long inline payload replaced by its identity (see the module docstring).

    `partial`: the text is the start of a longer one (a body still streaming in); a payload that may still be
    arriving at its end is cut off, so the result is a prefix of the whole text's result."""
    if not any(t in text for t in _TRIGGERS):
        return text
    out = _INLINE.sub(_masked, text)
    if partial:
        tail = _OPEN_TAIL.search(out)
        if tail is not None:
            out = out[: tail.start()]
    return out
