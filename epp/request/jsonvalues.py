"""The values of the streaming JSON reader (jsonstream.py): how each is taken, and where it goes.

`ValueReader` is mixed into `JsonStream`, which finds where values start (the token state machine); from there:
- runs of complete values are taken with one orjson call each (`_elements` in an array, `_whole` for a container
  member value); a container still incomplete past `DEEP_BYTES` is left to the state machine to enter;
- a string is taken whole, or, once longer than `LONG_STRING` and still incomplete, in pieces as they arrive;
- a complete value goes into its frame (`_place`: the top-level `model`'s span, `on_member`), and its canonical
  text into the sink of its collected member (`_emit`); the head member's text is published as it arrives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from epp.request.jsonscan import OPEN, candidates, safe_cut, string_end

DEEP_BYTES = 32 * 1024  # an incomplete value larger than this is tokenised rather than re-tried whole
LONG_STRING = 4096  # an incomplete string longer than this is read in pieces
_loads = orjson.loads
_dumps = orjson.dumps

# frame states
FIRST, COLON, VALUE, NEXT, KEY = 0, 1, 2, 3, 4


class Sink:
    """The canonical JSON text of one collected member, in pieces; `dirty`: recompute it from the value."""

    __slots__ = ("parts", "dirty", "head")

    def __init__(self, head: bool = False) -> None:
        self.parts: list[str] = []
        self.dirty = False
        self.head = head  # the head member's sink: its text is published as it arrives

    def text(self) -> str:
        return "".join(self.parts)


class Frame:
    """An object or array being read: its value so far, where reading is in it, and the sink of its text."""

    __slots__ = ("obj", "value", "state", "key", "sink", "keys", "start")

    def __init__(self, obj: bool, sink: Sink | None, start: int) -> None:
        self.obj = obj
        self.value: Any = {} if obj else []
        self.state = FIRST
        self.key: str | None = None
        self.sink = sink
        self.keys: set[str] | None = set() if obj and sink is not None else None
        self.start = start  # absolute offset of the opening bracket


class ValueReader:
    """Taking values and placing them (see the module docstring); the state is `JsonStream`'s."""

    __slots__ = ("collect", "head", "on_member", "texts", "model_span", "head_parts", "head_chars", "head_ok",
                 "_head_str", "_str", "_str_sink", "_str_start", "_str_head")
    _base: int  # JsonStream's: the absolute offset of the buffer's first byte
    _stack: list[Frame]  # JsonStream's: the containers entered, the top-level object first

    def __init__(self, collect: frozenset[str], head: str | None,
                 on_member: Callable[[str, Any], None] | None) -> None:
        self.collect = collect
        self.head = head
        self.on_member = on_member
        self.texts: dict[str, Sink] = {}
        self.model_span: tuple[int, int] | None = None  # absolute byte span of the top-level "model" value
        self.head_parts: list[str] = []  # the head member's text so far
        self.head_chars = 0
        self.head_ok = True  # false once the head text so far may not be a prefix of the final one
        self._head_str = False  # the head member's value is a string
        self._str: list[str] | None = None  # decoded pieces of a string value that spans chunks
        self._str_sink: Sink | None = None
        self._str_start = 0
        self._str_head = False  # the string being read is the head member's value

    # ---- where values go -------------------------------------------------------------------------------------
    def _emit(self, sink: Sink, text: str) -> None:
        sink.parts.append(text)
        if sink.head and not self._head_str and self.head_ok:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def _publish_string(self, text: str) -> None:
        if self.head_ok and text:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def _member_sink(self, key: str) -> Sink | None:
        if key not in self.collect:
            return None
        if key in self.texts and key == self.head:  # a repeated member: the last one wins, as in a dict
            self.head_ok = False
        sink = self.texts[key] = Sink(head=key == self.head)
        return sink

    def _place(self, f: Frame, v: object, start: int, end: int) -> None:
        """A complete value of frame f (its text, when collected, is already in the sink)."""
        if f.obj:
            key = f.key
            assert key is not None
            f.value[key] = v
            if len(self._stack) == 1:
                if key == "model":
                    self.model_span = (self._base + start, self._base + end)
                if self.on_member is not None:
                    self.on_member(key, v)
        else:
            f.value.append(v)
        f.state = NEXT

    # ---- complete values at once -----------------------------------------------------------------------------
    def _parse_run(self, buf: bytes, i: int, end: int) -> Any:
        """orjson.loads(buf[i:end]) as a list of values, nested as deep as they are (orjson's depth limit holds)."""
        depth = len(self._stack)
        vals = _loads(b"[" * depth + buf[i:end] + b"]" * depth)
        for _ in range(depth - 1):
            vals = vals[0]
        return vals

    def _elements(self, buf: bytes, i: int, f: Frame) -> int:
        """Take every complete element from buf[i] on with one orjson call. Returns the end (i: none taken)."""
        closer = OPEN.get(buf[i])
        for end in candidates(buf, i, closer, b",]"):
            try:
                vals = self._parse_run(buf, i, end)
            except ValueError:
                continue
            if not vals:
                return i
            f.value.extend(vals)
            f.state = NEXT
            if f.sink is not None:
                self._emit(f.sink, _dumps(vals).decode()[1:-1])
            return end
        return i

    def _whole(self, buf: bytes, i: int, f: Frame, sink: Sink | None) -> int:
        """A container member value at buf[i], taken with one orjson call once it is complete. Returns its end,
        -(i + 1) to wait for more data, -2 to enter it (too large to keep waiting)."""
        n = len(buf)
        if f.obj:
            for end in candidates(buf, i, OPEN[buf[i]], b",}"):
                try:
                    v = self._parse_run(buf, i, end)[0]
                except ValueError:
                    continue
                if sink is not None:
                    self._emit(sink, _dumps(v).decode())
                self._place(f, v, i, end)
                return end
        return -2 if n - i > DEEP_BYTES else -(i + 1)

    # ---- strings ---------------------------------------------------------------------------------------------
    def _string(self, buf: bytes, i: int, f: Frame, sink: Sink | None, head_string: bool) -> int:
        end = string_end(buf, i + 1)
        if end >= 0:
            v = _loads(buf[i : end + 1])
            if sink is not None:
                self._emit(sink, _dumps(v).decode() if buf.find(b"\\", i, end) >= 0 else '"' + v + '"')
            if head_string:
                self._publish_string(v)
            self._place(f, v, i, end + 1)
            return end + 1
        if len(buf) - i <= LONG_STRING:
            return -(i + 1)  # a short string: wait for its end
        self._str = []  # a long string: take its pieces as they come
        self._str_sink = sink
        self._str_head = head_string
        self._str_start = self._base + i
        if sink is not None:
            self._emit(sink, '"')
        return self._string_more(buf, i + 1)

    def _string_more(self, buf: bytes, i: int) -> int:
        parts = self._str
        assert parts is not None
        f = self._stack[-1]
        sink = self._str_sink
        end = string_end(buf, i)
        stop = end if end >= 0 else safe_cut(buf, i, len(buf))
        if stop > i:
            piece = buf[i:stop]
            v = _loads(b'"' + piece + b'"')
            parts.append(v)
            if sink is not None:
                self._emit(sink, _dumps(v).decode()[1:-1] if piece.find(b"\\") >= 0 else v)
            if self._str_head:
                self._publish_string(v)
        if end < 0:
            return stop
        self._str = None
        if sink is not None:
            self._emit(sink, '"')
        self._place(f, "".join(parts), self._str_start - self._base, end + 1)
        return end + 1
