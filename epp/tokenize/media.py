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
  engine's cache. An item sent by URL weighs its URL text.

  Only a payload that sits in a media part is masked (`media_payloads`): in the part's object (Responses'
  ``input_image`` / ``input_file``) or in an object the part holds (``image_url``'s ``{"url"}``, ``input_audio``,
  ``file``, Anthropic's ``source``), whichever order its members come in; a string anywhere else (a text quoting a
  data URL, a tool's arguments) is text. The rule reads the JSON text's structure, so the whole prompt and the
  streaming head (a prefix of it, `partial`) apply the same one: the head is cut before a payload whose part has
  not closed yet, and it masks what the whole prompt masks. Cost: a body without a media part is never scanned
  (`holds_media`, a walk over its structure); a text without ``"data`` or ``"file_data"`` is returned as is (two
  substring searches); else one pass over the text's structure, each string skipped by a C search (a megabyte
  of base64 costs microseconds; a JSON string or bracket about a microsecond), each payload hashed once; the body
  itself is bounded by the ext_proc body limit (413 past it). URLs are short and stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from scheduling.types import CHARS_PER_TOKEN

INLINE_MIN = 256  # characters from which an inline payload is masked
MEDIA_TOKENS = 256  # what a masked item weighs in the prompt text: a nominal placeholder count (see above)
_MEDIA_CHARS = MEDIA_TOKENS * CHARS_PER_TOKEN

# An inline payload: a JSON string opening with "data:" (its payload after the first comma), or the value of "data"
# / "file_data"; masked only where it sits in a media part (`media_payloads`).
_PAYLOAD_KEYS = frozenset({"data", "file_data"})
_HEAD_MAX = 200  # characters of a data URL before its comma ("data:image/png;base64")
# The structure of canonical JSON: where a string or a bracket starts (strings are skipped with str.find).
_STRUCT = re.compile(r'["{}\[\]]')


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


class _Frame:
    """An object or array open at a point of the text, and the payloads found in it that wait for its type."""

    __slots__ = ("obj", "key", "type", "own", "child")

    def __init__(self, obj: bool) -> None:
        self.obj = obj
        self.key = ""  # the member being read (objects)
        self.type: str | None = None  # its "type" member's value, when short
        self.own: list[_Span] = []  # payloads of its own members
        self.child: list[_Span] = []  # payloads of the objects among its members


_Span = tuple[int, int, int]  # a payload: its start and end in the text, and where its string opens


def _payload(text: str, s: int, e: int, key: str) -> int | None:
    """Where the inline payload in the JSON string text[s:e] (its characters between the quotes) starts: after the
    comma of a data URL, or the whole value of "data" / "file_data"; None when it holds none long enough."""
    if text.startswith("data:", s, e):
        comma = text.find(",", s + 5, min(e, s + _HEAD_MAX))
        if comma < 0:
            return None
        start = comma + 1
    elif key in _PAYLOAD_KEYS:
        start = s
    else:
        return None
    if e - start < INLINE_MIN or text.find("\\", s, e) >= 0:
        return None
    return start


def _string_end(text: str, s: int) -> int:
    """One past the closing quote of the JSON string opening at `s`; -1 when it does not close in `text`."""
    q = s
    while (q := text.find('"', q + 1)) >= 0:
        k = q
        while text[k - 1] == "\\":
            k -= 1
        if not (q - k) & 1:  # an even number of backslashes before it: not escaped
            return q + 1
    return -1


def _close(stack: list[_Frame], spans: list[_Span]) -> None:
    """The innermost frame closed: its payloads are media when its type is a media kind, else an object's own pass
    to the object holding it (a part keeps its payload one level down: image_url's {"url"}, Anthropic's source)."""
    f = stack.pop()
    if not f.obj:
        return
    if f.type in _REFS:
        spans += f.own
        spans += f.child
    elif f.own and stack and stack[-1].obj:
        stack[-1].child += f.own


def media_payloads(text: str, partial: bool = False) -> tuple[list[_Span], int]:
    """The inline payloads of canonical JSON `text` that sit in a media part (an object whose "type" is a kind
    `media_ref` reads, or an object it holds), in order, and how much of the text is decided (all of it, or with
    `partial` where the first payload not yet known to be in a media part or not, or a string still open, starts)."""
    spans: list[_Span] = []
    stack: list[_Frame] = []
    cut = n = len(text)
    pos = 0
    while (m := _STRUCT.search(text, pos)) is not None:
        s = m.start()
        c = text[s]
        if c != '"':
            if c in "{[":
                stack.append(_Frame(c == "{"))
            elif stack:
                _close(stack, spans)
            pos = s + 1
            continue
        e = _string_end(text, s)  # one past the closing quote (a C search: a megabyte of base64 costs microseconds)
        if e < 0:  # a string still open: only at the end of a partial text
            cut = s
            break
        pos = e
        f = stack[-1] if stack else None
        if f is None or not f.obj:
            continue
        if e < n and text[e] == ":":
            f.key = text[s + 1 : e - 1] if e - s < 64 else ""
        elif f.key == "type":
            f.type = text[s + 1 : e - 1] if e - s < 64 else None
        elif (p := _payload(text, s + 1, e - 1, f.key)) is not None:
            f.own.append((p, e - 1, s))
    if partial:
        cut = min([cut] + [sp[2] for f in stack for sp in (*f.own, *f.child)])
    spans.sort()
    return spans, cut


def mask_media(text: str, partial: bool = False) -> str:
    """`text` (canonical JSON) with each long inline payload of a media part replaced by its identity (see the
    module docstring).

    `partial`: the text is the start of a longer one (a body still streaming in); it is cut where what follows could
    still change the result (a payload whose part has not closed, a string still open), so the result is a prefix
    of the whole text's result."""
    # A payload's string or key: the common case, none. `rfind`, not `in`: CPython's backward search skips on the
    # pattern's first character (a quote, rare in a prompt's text), its forward one on the last (a letter): about
    # 3x faster over a long head, whose tail the search reads first anyway.
    if text.rfind('"data') < 0 and text.rfind('"file_data"') < 0:
        return text
    spans, cut = media_payloads(text, partial)
    out: list[str] = []
    pos = 0
    for start, end, opening in spans:
        if opening >= cut:
            break
        out.append(text[pos:start])
        out.append(f"#media:{identity('inline', text[start:end])}".ljust(_MEDIA_CHARS, "~"))
        pos = end
    out.append(text[pos:cut])
    return "".join(out)


def head_holds_media(text: str) -> bool:
    """Whether canonical JSON `text` (a body's prompt head) holds a media part: a "type" member naming a kind
    `media_ref` reads (in canonical JSON a quote inside a string is escaped, so the pair is structure)."""
    return text.rfind('"type":"') >= 0 and any(f'"type":"{kind}"' in text for kind in _REFS)  # rfind: mask_media
