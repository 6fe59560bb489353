"""A request body read as it streams in: the fields routing needs, exactly as `parsing.parse_body` gives them.

`StreamingBody(kind).feed(chunk)` for every chunk, then `finish()` -> `ParsedBody`. The top-level object is read by
`epp.request.jsonstream.JsonStream`; the prompt-bearing members of the API kind are collected as their canonical
JSON text (what `orjson.dumps` gives), so the prompt is the same string `parse_body` builds without serialising the
messages again. Meanwhile:
- `model` is the top-level `model` once its value has arrived;
- `head_chars` / `head_text()` is the first part of the prompt as far as it has arrived, for the kinds whose prompt
  starts with one member (chat: `messages`; completions: `prompt`; embeddings: `input`; conversations: `items`).
  Responses (`instructions` + `tools` + `input`) and Anthropic messages (`system` + `tools` + `messages`) have no
  head: a member that comes later in the body may come first in the prompt.

A body the reader does not accept is parsed whole by `parse_body`, which gives today's exact error (or, should the
reader have refused a valid body, today's result): the reader never changes what a body means.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.request.jsonstream import JsonStream
from epp.request.jsonvalues import DEEP_BYTES
from epp.request.parsing import MEDIA_KINDS, ParsedBody, parse_body, validate
from epp.tokenize import head_holds_media, mask_media
from scheduling.types import ApiKind

COLLECT: dict[ApiKind, frozenset[str]] = {
    ApiKind.CHAT: frozenset({"messages", "tools"}),
    ApiKind.COMPLETIONS: frozenset({"prompt"}),
    ApiKind.EMBEDDINGS: frozenset({"input"}),
    ApiKind.RESPONSES: frozenset({"instructions", "tools", "input"}),
    ApiKind.CONVERSATIONS: frozenset({"items"}),
    ApiKind.MESSAGES: frozenset({"system", "tools", "messages"}),
}
HEAD: dict[ApiKind, str] = {
    ApiKind.CHAT: "messages",
    ApiKind.COMPLETIONS: "prompt",
    ApiKind.EMBEDDINGS: "input",
    ApiKind.CONVERSATIONS: "items",
}


class StreamingBody:
    """One request body, fed chunk by chunk (see the module docstring)."""

    __slots__ = ("kind", "stream", "chunks", "size", "read", "_at", "_parsed", "_reading", "_head")

    def __init__(self, kind: ApiKind) -> None:
        self.kind = kind
        self.stream = JsonStream(COLLECT.get(kind, frozenset()), HEAD.get(kind))
        self.chunks: list[bytes | memoryview] = []  # as they came: a chunk read from the wire is a view
        self.size = 0
        self.read = 0  # bytes of the body the stream has read
        self._at = (0, 0)  # where the stream is: chunk index, offset in it
        self._parsed: ParsedBody | None = None
        self._reading = False  # the stream has been fed (from the second chunk on, or since `start`)
        self._head: tuple[int, str] | None = None  # head_text() as of that many head parts

    def __len__(self) -> int:
        return self.size

    def feed(self, data: bytes | memoryview, *, read: bool = True) -> None:
        """One more chunk. The first is only kept (a view stays a view): a body that comes whole (BUFFERED, small
        bodies, a long body Envoy sends in one message) is parsed by `parse_body` at once, with nothing read twice
        or copied; reading starts with the second chunk. With `read=False` the chunk is only kept: the caller
        reads it with `start(upto)`, a part at a time."""
        if not data:
            return
        chunks = self.chunks
        chunks.append(data)
        self.size += len(data)
        if read and (self._reading or len(chunks) >= 2):
            self.start()

    def start(self, upto: int | None = None) -> None:
        """Read what has come so far now, up to the first `upto` bytes of the body (None: all of it): the caller
        wants the model or the prompt's head before a second chunk, or before the rest of this one."""
        self._reading = True
        # A slice of what is held: waiting for the rest of a long value would only re-read it at the next slice.
        self.stream.deep = 0 if upto is not None and upto < self.size else DEEP_BYTES
        left = (self.size if upto is None else min(upto, self.size)) - self.read
        if left <= 0:
            return
        chunks, feed = self.chunks, self.stream.feed
        i, o = self._at
        while left > 0:
            c = chunks[i]
            take = min(len(c) - o, left)
            feed(bytes(c[o : o + take]))  # a whole bytes chunk is not copied
            o += take
            left -= take
            self.read += take
            if o == len(c):
                i, o = i + 1, 0
        self._at = (i, o)

    @property
    def reading(self) -> bool:
        """Whether the stream has begun to read the body (else `finish` parses it whole)."""
        return self._reading

    @property
    def model(self) -> str | None:
        """The top-level `model`, once its value has arrived (a non-empty string), else None."""
        v = self.stream.value.get("model") if self.stream.members.model_span is not None else None
        return v if isinstance(v, str) and v else None

    @property
    def head_chars(self) -> int:
        """Characters of the prompt's first part that have arrived (0 for kinds without a head)."""
        m = self.stream.members
        return m.head_chars if m.head_ok and self.stream.error is None else 0

    def head_text(self) -> str:
        """The prompt's first part as far as it has arrived, media masked as in the whole prompt: the payloads of
        the media parts that have closed, cut before a payload whose part has not (nor is known not to be media) and
        before a string still arriving, so it is a prefix of the prompt `finish` gives. Both apply one structural
        rule (`mask_media`): a string outside a media part is text, masked in neither."""
        parts = self.stream.members.head_parts
        if self._head is not None and self._head[0] == len(parts):
            return self._head[1]
        text = "".join(parts)
        if self.kind in MEDIA_KINDS:
            text = mask_media(text, partial=True)
        self._head = (len(parts), text)
        return text

    def head(self) -> tuple[str, bool]:
        """`head_text()` and whether the head holds a media part so far."""
        text = self.head_text()
        return text, self.kind in MEDIA_KINDS and head_holds_media(text)

    def partial(self) -> dict[str, Any]:
        """The top-level members that have arrived (for a decision made before the body ended, or on the head at
        its end: then with those `complete` added)."""
        return self.stream.value

    def complete(self, members: Mapping[str, Any]) -> None:
        """Top-level members the reader did not read (it stopped after the head; one scan of the whole body found
        them: epp/request/early.py) join those it did, the later of a name winning, as in JSON."""
        self.stream.value.update(members)

    def raw(self) -> bytes | memoryview:
        chunks = self.chunks
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def finish(self) -> ParsedBody:
        """The parsed body, as `parse_body(kind, raw)` gives it; raises the same SchedulingError for a bad body."""
        if self._parsed is not None:
            return self._parsed
        s = self.stream
        if not self._reading:  # came whole: one orjson call
            self._parsed = parse_body(self.kind, self.raw())
            return self._parsed
        self.start()  # what was kept and not read yet
        if not s.finish():
            self._parsed = parse_body(self.kind, self.raw())
            return self._parsed
        self._parsed = validate(self.kind, s.value, s.members.texts())
        return self._parsed

    def rewritten_prefix(self, model: str, upto: int) -> bytes | None:
        """The first `upto` bytes of the body with the top-level model value replaced by `model` (a model rewrite
        decided before the body ended); None when the model's value has not arrived."""
        span = self.stream.members.model_span
        if span is None or span[1] > upto:
            return None
        import orjson

        raw = bytes(self.raw()[:upto])
        return raw[: span[0]] + orjson.dumps(model) + raw[span[1] :]
