"""The values of the streaming JSON reader (jsonstream.py): where their text goes, and the parts of taking them.

`JsonStream` finds where values start (the token state machine) and takes them; what it hands on lives here:
- `Members`: the top-level members as they start and complete: the canonical text of each collected member in its
  `Sink`, the head member's text published as it arrives, the top-level `model`'s span, `on_member`;
- `LongString`: a string longer than `LONG_STRING` and still incomplete, read in pieces as they arrive;
- `complete_run`: a run of complete values taken with one orjson call (nested as deep as they are).
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


class Members:
    """The top-level members as they start and complete (see the module docstring).

    `collect`: the member names whose canonical JSON text is wanted (`texts()`); `head`: the one among them whose
    text is published as it arrives (`head_parts`, `head_chars`; a string head as the string itself)."""

    __slots__ = ("collect", "head", "on_member", "sinks", "model_span", "head_parts", "head_chars", "head_ok",
                 "head_str", "_at", "_cur")

    def __init__(self, collect: frozenset[str], head: str | None,
                 on_member: Callable[[str, Any], None] | None) -> None:
        self.collect = collect
        self.head = head
        self.on_member = on_member
        self.sinks: dict[str, Sink] = {}
        self.model_span: tuple[int, int] | None = None  # absolute byte span of the top-level "model" value
        self.head_parts: list[str] = []  # the head member's text so far
        self.head_chars = 0
        self.head_ok = True  # false once the head text so far may not be a prefix of the final one
        self.head_str = False  # the head member's value is a string
        self._at = -1  # where the member value whose sink is _cur starts (a value waited for)
        self._cur: Sink | None = None

    def begin(self, key: str, at: int, string: bool) -> Sink | None:
        """The value of member `key` starts at absolute offset `at` (a string when `string`): the sink of its text,
        the same one when it starts there again after waiting for more data."""
        if at != self._at:
            self._at, self._cur = at, self._sink(key)
        if key == self.head:
            self.head_str = string
        if key == "model":
            self.model_span = None
        return self._cur

    def _sink(self, key: str) -> Sink | None:
        if key not in self.collect:
            return None
        if key in self.sinks and key == self.head:  # a repeated member: the last one wins, as in a dict
            self.head_ok = False
        sink = self.sinks[key] = Sink(head=key == self.head)
        return sink

    def done(self, key: str, v: Any, start: int, end: int) -> None:
        """Member `key` completed with value v, at absolute offsets start to end."""
        if key == "model":
            self.model_span = (start, end)
        if self.on_member is not None:
            self.on_member(key, v)

    def emit(self, sink: Sink, text: str) -> None:
        sink.parts.append(text)
        if sink.head and not self.head_str and self.head_ok:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def publish(self, text: str) -> None:
        """A piece of the head member's string value."""
        if self.head_ok and text:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def texts(self) -> dict[str, str]:
        """The collected members' texts, but those to be recomputed from the value."""
        return {k: sink.text() for k, sink in self.sinks.items() if not sink.dirty}


class LongString:
    """A string value read in pieces as they arrive, each validated and decoded by orjson."""

    __slots__ = ("parts", "sink", "head", "start", "members", "complete")

    def __init__(self, members: Members, sink: Sink | None, head: bool, start: int) -> None:
        self.parts: list[str] = []  # the decoded pieces
        self.sink = sink
        self.head = head  # the head member's value
        self.start = start  # absolute offset of the opening quote
        self.members = members
        self.complete = False
        if sink is not None:
            members.emit(sink, '"')

    def more(self, buf: bytes, i: int) -> int:
        """Take the pieces from buf[i] on: returns where reading goes on (`complete` once the string ended)."""
        sink = self.sink
        end = string_end(buf, i)
        stop = end if end >= 0 else safe_cut(buf, i, len(buf))
        if stop > i:
            piece = buf[i:stop]
            v = _loads(b'"' + piece + b'"')
            self.parts.append(v)
            if sink is not None:
                self.members.emit(sink, _dumps(v).decode()[1:-1] if piece.find(b"\\") >= 0 else v)
            if self.head:
                self.members.publish(v)
        if end < 0:
            return stop
        self.complete = True
        if sink is not None:
            self.members.emit(sink, '"')
        return end + 1

    def value(self) -> str:
        return "".join(self.parts)


def complete_run(buf: bytes, i: int, follow: bytes, depth: int) -> tuple[int, list[Any]]:
    """The values of the first run from buf[i] on that parses whole, ending at a candidate end followed by one of
    `follow`, with one orjson call nested `depth` deep (so orjson's depth limit holds): (its end, its values), or
    (i, []) when none does yet."""
    for end in candidates(buf, i, OPEN.get(buf[i]), follow):
        try:
            vals = _loads(b"[" * depth + buf[i:end] + b"]" * depth)
        except ValueError:
            continue
        for _ in range(depth - 1):
            vals = vals[0]
        return end, vals
    return i, []
