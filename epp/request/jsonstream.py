"""A streaming JSON reader for a request body's top-level object: values as they complete, prompt text as it arrives.

`JsonStream.feed(chunk)` takes the body in pieces of any size; `finish()` says whether it was a well-formed JSON
object. Meanwhile `value` (the top-level dict) holds every member that has completed, `model_span` where the
top-level `model` value lies, and every *collected* member (the prompt-bearing fields) gets its canonical JSON text
(what `orjson.dumps` of its value gives) built piece by piece in a `Sink`; the *head* member's text (the first part
of the prompt) is also published as it arrives, so prefix blocks can be hashed before the body ends.

Cost: orjson does the per-byte work, Python works per chunk and per token it cannot skip.
- Where an array element or a member value is expected, the reader tries to take every complete value at once:
  it looks for a candidate end (the last closing bracket followed by `,`, `]` or `}`) and lets orjson parse the
  run up to it. Lexing is deterministic, so a run that parses is a run of complete values; one that fails (the
  candidate was inside a string) is retried when more data has come.
- A value still incomplete past `DEEP_BYTES` (`deep`) is entered instead (tokenised by Python); at once, whatever
  its size, while the reader is fed slices of a body it already holds (a long body read only as far as the
  decision needs: epp/request/early.py), since what it would wait for is only the next slice. Such a value is made of
  long strings, whose pieces are validated and decoded by orjson as they arrive (cut at escape and UTF-8
  boundaries, never between the halves of a surrogate pair); string ends are found with `bytes.find`, and only a
  string with backslashes before its candidate end asks orjson where it really ends.
So no value is parsed twice, and the work left for the last chunk is that chunk's.

Here is the token state machine (which token comes next, containers entered and closed, waiting for more data) and
how a value is taken once it starts; where it goes, with its text, is `Members`' (jsonvalues.py, with `LongString`,
`complete_run`, `DEEP_BYTES` and `LONG_STRING`); where strings and runs end is found by jsonscan.py.

Exactness: pieces and runs are parsed by orjson itself, containers are nested no deeper than orjson allows (a run is
parsed inside as many brackets as it is deep), and anything the reader does not handle exactly (a duplicate key
inside a collected value, a repeated collected member) marks the text to be recomputed from the value. Any error
sets `error`: the caller then parses the whole body with orjson, which gives the exact message (or, if the reader
was wrong to refuse, the result).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from epp.request.jsonscan import OPEN, WS, WS_SET, string_end
from epp.request.jsonvalues import (
    COLON,
    DEEP_BYTES,
    FIRST,
    KEY,
    LONG_STRING,
    NEXT,
    VALUE,
    Frame,
    LongString,
    Members,
    Sink,
    complete_run,
)

MAX_DEPTH = 1024  # orjson's nesting limit
_SCALAR_END = frozenset(b" \t\n\r,]}")
_loads = orjson.loads
_dumps = orjson.dumps


class JsonStream:
    """Reads one JSON object in pieces (see the module docstring).

    `collect`: top-level member names whose canonical JSON text is wanted (`members.texts()` after `finish`).
    `head`: the one among them whose text is published as it arrives (`members.head_parts`, `head_chars`); a string
    head is published as the string itself (the prompt of a completion is the string, not its JSON).
    `on_member(name, value)` is called as top-level members complete."""

    __slots__ = ("value", "error", "done", "deep", "_buf", "_base", "_stack", "_pre", "_str", "members")

    def __init__(self, collect: frozenset[str] = frozenset(), head: str | None = None,
                 on_member: Callable[[str, Any], None] | None = None) -> None:
        self.members = Members(collect, head, on_member)
        self.value: dict[str, Any] = {}  # the top-level members completed so far
        self.error: str | None = None
        self.done = False  # the top-level object closed
        # An incomplete container value longer than this is entered rather than waited for (`DEEP_BYTES`); 0 while
        # the reader is fed a slice of a body it already holds whole: the rest is no new data, only the next slice.
        self.deep = DEEP_BYTES
        self._buf = b""  # unconsumed bytes
        self._base = 0  # absolute offset of _buf[0]
        self._stack: list[Frame] = []
        self._str: LongString | None = None  # a string value that spans chunks
        self._pre = True  # before the top-level '{'

    # ---- input ---------------------------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if self.error is not None or not data:
            return
        self._buf = self._buf + data if self._buf else data
        try:
            self._run()
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # orjson's JSONDecodeError is a ValueError
            self.error = str(e) or type(e).__name__

    def finish(self) -> bool:
        """True when the input was one well-formed JSON object (with nothing but whitespace after it)."""
        if self.error is None and not self.done:
            self.error = "unexpected end of data"
        return self.error is None

    def received(self) -> int:
        """Bytes consumed so far (the absolute offset of the first byte not read)."""
        return self._base

    # ---- the reader ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        buf = self._buf
        i, n = 0, len(buf)
        stack = self._stack
        while True:
            if self._str is not None:  # inside a string value that spans chunks: its whitespace is its text
                i = self._string_more(buf, i)
                if self._str is not None:
                    break
                continue
            while i < n and buf[i] in WS_SET:
                i += 1
            if i >= n:
                break
            if self._pre:
                i = self._open_top(buf, i)
                continue
            if not stack:
                raise ValueError("content after the object")
            f = stack[-1]
            j = self._in_object(buf, i, f) if f.obj else self._in_array(buf, i, f)
            if j < 0:  # wait for more data at -j - 1
                i = -j - 1
                break
            i = j
        self._base += i
        self._buf = buf[i:]

    def _open_top(self, buf: bytes, i: int) -> int:
        if buf[i] != 0x7B:
            raise ValueError("not a JSON object")
        self._pre = False
        top = Frame(True, None, self._base + i)
        self.value = top.value
        self._stack.append(top)
        return i + 1

    def _in_object(self, buf: bytes, i: int, f: Frame) -> int:
        """One token inside an object: where reading goes on, or -(i + 1) to wait for more data at i."""
        c, st = buf[i], f.state
        if st == FIRST or st == KEY:
            if c == 0x7D and st == FIRST:
                return self._close(buf, i)
            if c != 0x22:
                raise ValueError("expected a key")
            end = string_end(buf, i + 1)
            if end < 0:
                return -i - 1  # the key is not complete yet
            key = _loads(buf[i : end + 1])
            f.key = key
            if f.keys is not None:
                if key in f.keys and f.sink is not None:
                    f.sink.dirty = True
                f.keys.add(key)
            if f.sink is not None:
                self.members.emit(f.sink, ("," if st == KEY else "") + _dumps(key).decode() + ":")
            f.state = COLON
            return end + 1
        if st == COLON:
            if c != 0x3A:
                raise ValueError("expected ':'")
            f.state = VALUE
            return i + 1
        if st == VALUE:
            return self._value(buf, i, f)
        if c == 0x2C:
            f.state = KEY
            return i + 1
        if c == 0x7D:
            return self._close(buf, i)
        raise ValueError("expected ',' or '}'")

    def _in_array(self, buf: bytes, i: int, f: Frame) -> int:
        """One token or a run of complete elements inside an array (as `_in_object`)."""
        c, st = buf[i], f.state
        if st == NEXT:
            if c == 0x2C:
                f.state = VALUE
                if f.sink is not None:
                    self.members.emit(f.sink, ",")
                return i + 1
            if c == 0x5D:
                return self._close(buf, i)
            raise ValueError("expected ',' or ']'")
        if c == 0x5D and st == FIRST:
            return self._close(buf, i)
        end, vals = complete_run(buf, i, b",]", len(self._stack))  # every complete element at once
        if not vals:
            return self._value(buf, i, f)
        f.value.extend(vals)
        f.state = NEXT
        if f.sink is not None:
            self.members.emit(f.sink, _dumps(vals).decode()[1:-1])
        return end

    def _value(self, buf: bytes, i: int, f: Frame) -> int:
        """A value starts at buf[i] (not whitespace): place it, or enter it. Returns where reading goes on, or
        -(i + 1) to wait for more data at i."""
        c = buf[i]
        stack = self._stack
        sink = f.sink
        head_value = False
        if len(stack) == 1:  # a top-level member
            key = f.key
            assert key is not None
            sink = self.members.begin(key, self._base + i, c == 0x22)
            head_value = c == 0x22 and key == self.members.head
        if c == 0x22:
            return self._string(buf, i, f, sink, head_value)
        if c in OPEN:
            if sink is None or len(stack) > 1:  # a collected member is entered at once: its text streams
                j = self._whole(buf, i, f, sink)
                if j != -2:
                    return j
            if len(stack) >= MAX_DEPTH:
                raise ValueError("depth limit exceeded")
            g = Frame(c == 0x7B, sink, self._base + i)
            stack.append(g)
            if sink is not None:
                self.members.emit(sink, "{" if g.obj else "[")
            return i + 1
        # a number or a literal: up to the next delimiter
        j = i + 1
        n = len(buf)
        while j < n and buf[j] not in _SCALAR_END:
            j += 1
        if j >= n:
            return -(i + 1)
        v = _loads(buf[i:j])
        if sink is not None:
            self.members.emit(sink, _dumps(v).decode())
        self._place(f, v, i, j)
        return j

    def _close(self, buf: bytes, i: int) -> int:
        stack = self._stack
        g = stack.pop()
        if not stack:
            self.value = g.value
            self.done = True
            if buf[i + 1 :].strip(WS):
                raise ValueError("content after the object")
            return len(buf)
        if g.sink is not None:
            self.members.emit(g.sink, "}" if g.obj else "]")
        self._place(stack[-1], g.value, g.start - self._base, i + 1)
        return i + 1

    # ---- taking values ---------------------------------------------------------------------------------------
    def _place(self, f: Frame, v: Any, start: int, end: int) -> None:
        """A complete value of frame f (its text, when collected, is already in the sink)."""
        if f.obj:
            key = f.key
            assert key is not None
            f.value[key] = v
            if len(self._stack) == 1:
                self.members.done(key, v, self._base + start, self._base + end)
        else:
            f.value.append(v)
        f.state = NEXT

    def _whole(self, buf: bytes, i: int, f: Frame, sink: Sink | None) -> int:
        """A container member value at buf[i], taken with one orjson call once it is complete. Returns its end,
        -(i + 1) to wait for more data, -2 to enter it (too large to keep waiting)."""
        if f.obj:
            end, vals = complete_run(buf, i, b",}", len(self._stack))
            if vals:
                v = vals[0]
                if sink is not None:
                    self.members.emit(sink, _dumps(v).decode())
                self._place(f, v, i, end)
                return end
        return -2 if len(buf) - i > self.deep else -(i + 1)

    def _string(self, buf: bytes, i: int, f: Frame, sink: Sink | None, head_string: bool) -> int:
        end = string_end(buf, i + 1)
        if end >= 0:
            v = _loads(buf[i : end + 1])
            if sink is not None:
                self.members.emit(sink, _dumps(v).decode() if buf.find(b"\\", i, end) >= 0 else '"' + v + '"')
            if head_string:
                self.members.publish(v)
            self._place(f, v, i, end + 1)
            return end + 1
        if len(buf) - i <= LONG_STRING:
            return -(i + 1)  # a short string: wait for its end
        self._str = LongString(self.members, sink, head_string, self._base + i)  # take its pieces as they come
        return self._string_more(buf, i + 1)

    def _string_more(self, buf: bytes, i: int) -> int:
        s = self._str
        assert s is not None
        j = s.more(buf, i)
        if s.complete:
            self._str = None
            self._place(self._stack[-1], s.value(), s.start - self._base, j)
        return j
