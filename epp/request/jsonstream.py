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
- A value still incomplete past `DEEP_BYTES` is entered instead (tokenised by Python): such a value is made of
  long strings, whose pieces are validated and decoded by orjson as they arrive (cut at escape and UTF-8
  boundaries, never between the halves of a surrogate pair); string ends are found with `bytes.find`, and only a
  string with backslashes before its candidate end asks orjson where it really ends.
So no value is parsed twice, and the work left for the last chunk is that chunk's.

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

DEEP_BYTES = 32 * 1024  # an incomplete value larger than this is tokenised rather than re-tried whole
LONG_STRING = 4096  # an incomplete string longer than this is read in pieces
MAX_DEPTH = 1024  # orjson's nesting limit
_WS = b" \t\n\r"
_WS_SET = frozenset(_WS)
_OPEN = {0x7B: 0x7D, 0x5B: 0x5D}  # { -> }, [ -> ]
_SCALAR_END = frozenset(b" \t\n\r,]}")
_loads = orjson.loads
_dumps = orjson.dumps
_JSONError = orjson.JSONDecodeError

# frame states
_FIRST, _COLON, _VALUE, _NEXT, _KEY = 0, 1, 2, 3, 4


class Sink:
    """The canonical JSON text of one collected member, in pieces; `dirty`: recompute it from the value."""

    __slots__ = ("parts", "dirty", "head")

    def __init__(self, head: bool = False) -> None:
        self.parts: list[str] = []
        self.dirty = False
        self.head = head  # the head member's sink: its text is published as it arrives

    def text(self) -> str:
        return "".join(self.parts)


class _Frame:
    __slots__ = ("obj", "value", "state", "key", "sink", "keys", "start")

    def __init__(self, obj: bool, sink: Sink | None, start: int) -> None:
        self.obj = obj
        self.value: Any = {} if obj else []
        self.state = _FIRST
        self.key: str | None = None
        self.sink = sink
        self.keys: set[str] | None = set() if obj and sink is not None else None
        self.start = start  # absolute offset of the opening bracket


class JsonStream:
    """Reads one JSON object in pieces (see the module docstring).

    `collect`: top-level member names whose canonical JSON text is wanted (`texts` after `finish`). `head`: the one
    among them whose text is published as it arrives (`head_parts`, `head_chars`); a string head is published as
    the string itself (the prompt of a completion is the string, not its JSON). `on_member(name, value)` is called
    as top-level members complete."""

    __slots__ = ("collect", "head", "on_member", "value", "texts", "error", "done", "model_span", "head_parts",
                 "head_chars", "head_ok", "_buf", "_base", "_stack", "_str", "_str_sink", "_str_start",
                 "_str_head", "_head_str", "_sink_at", "_sink_cur", "_pre")

    def __init__(self, collect: frozenset[str] = frozenset(), head: str | None = None,
                 on_member: Callable[[str, Any], None] | None = None) -> None:
        self.collect = collect
        self.head = head
        self.on_member = on_member
        self.value: dict[str, Any] = {}  # the top-level members completed so far
        self.texts: dict[str, Sink] = {}
        self.error: str | None = None
        self.done = False  # the top-level object closed
        self.model_span: tuple[int, int] | None = None  # absolute byte span of the top-level "model" value
        self.head_parts: list[str] = []  # the head member's text so far
        self.head_chars = 0
        self.head_ok = True  # false once the head text so far may not be a prefix of the final one
        self._buf = b""  # unconsumed bytes
        self._base = 0  # absolute offset of _buf[0]
        self._stack: list[_Frame] = []
        self._str: list[str] | None = None  # decoded pieces of a string value that spans chunks
        self._str_sink: Sink | None = None
        self._str_start = 0
        self._str_head = False  # the string being read is the head member's value
        self._head_str = False  # the head member's value is a string
        self._sink_at = -1  # where the member value whose sink is _sink_cur starts (a value waited for)
        self._sink_cur: Sink | None = None
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
            while i < n and buf[i] in _WS_SET:
                i += 1
            if self._str is not None:  # inside a string value that spans chunks
                i = self._string_more(buf, i)
                if self._str is not None:
                    break
                continue
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
        top = _Frame(True, None, self._base + i)
        self.value = top.value
        self._stack.append(top)
        return i + 1

    def _in_object(self, buf: bytes, i: int, f: _Frame) -> int:
        """One token inside an object: where reading goes on, or -(i + 1) to wait for more data at i."""
        c, st = buf[i], f.state
        if st == _FIRST or st == _KEY:
            if c == 0x7D and st == _FIRST:
                return self._close(buf, i)
            if c != 0x22:
                raise ValueError("expected a key")
            end = _string_end(buf, i + 1)
            if end < 0:
                return -i - 1  # the key is not complete yet
            key = _loads(buf[i : end + 1])
            f.key = key
            if f.keys is not None:
                if key in f.keys and f.sink is not None:
                    f.sink.dirty = True
                f.keys.add(key)
            if f.sink is not None:
                self._emit(f.sink, ("," if st == _KEY else "") + _dumps(key).decode() + ":")
            f.state = _COLON
            return end + 1
        if st == _COLON:
            if c != 0x3A:
                raise ValueError("expected ':'")
            f.state = _VALUE
            return i + 1
        if st == _VALUE:
            return self._value(buf, i, f)
        if c == 0x2C:
            f.state = _KEY
            return i + 1
        if c == 0x7D:
            return self._close(buf, i)
        raise ValueError("expected ',' or '}'")

    def _in_array(self, buf: bytes, i: int, f: _Frame) -> int:
        """One token or a run of complete elements inside an array (as `_in_object`)."""
        c, st = buf[i], f.state
        if st == _NEXT:
            if c == 0x2C:
                f.state = _VALUE
                if f.sink is not None:
                    self._emit(f.sink, ",")
                return i + 1
            if c == 0x5D:
                return self._close(buf, i)
            raise ValueError("expected ',' or ']'")
        if c == 0x5D and st == _FIRST:
            return self._close(buf, i)
        j = self._elements(buf, i, f)
        return self._value(buf, i, f) if j == i else j

    def _emit(self, sink: Sink, text: str) -> None:
        sink.parts.append(text)
        if sink.head and not self._head_str and self.head_ok:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def _publish_string(self, text: str) -> None:
        if self.head_ok and text:
            self.head_parts.append(text)
            self.head_chars += len(text)

    def _value(self, buf: bytes, i: int, f: _Frame) -> int:
        """A value starts at buf[i] (not whitespace): place it, or enter it. Returns where reading goes on, or
        -(i + 1) to wait for more data at i."""
        c = buf[i]
        stack = self._stack
        sink = f.sink
        head_value = False
        if len(stack) == 1:  # a top-level member
            key = f.key
            assert key is not None
            at = self._base + i
            if at != self._sink_at:  # (not the same value again after waiting for more data)
                self._sink_at, self._sink_cur = at, self._member_sink(key)
            sink = self._sink_cur
            if key == self.head:
                self._head_str = head_value = c == 0x22
            if key == "model":
                self.model_span = None
        if c == 0x22:
            return self._string(buf, i, f, sink, head_value)
        if c in _OPEN:
            if sink is None or len(stack) > 1:  # a collected member is entered at once: its text streams
                j = self._whole(buf, i, f, sink)
                if j != -2:
                    return j
            if len(stack) >= MAX_DEPTH:
                raise ValueError("depth limit exceeded")
            g = _Frame(c == 0x7B, sink, self._base + i)
            stack.append(g)
            if sink is not None:
                self._emit(sink, "{" if g.obj else "[")
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
            self._emit(sink, _dumps(v).decode())
        self._place(f, v, i, j)
        return j

    def _member_sink(self, key: str) -> Sink | None:
        if key not in self.collect:
            return None
        if key in self.texts and key == self.head:  # a repeated member: the last one wins, as in a dict
            self.head_ok = False
        sink = self.texts[key] = Sink(head=key == self.head)
        return sink

    def _place(self, f: _Frame, v: Any, start: int, end: int) -> None:
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
        f.state = _NEXT

    def _close(self, buf: bytes, i: int) -> int:
        stack = self._stack
        g = stack.pop()
        if not stack:
            self.value = g.value
            self.done = True
            if buf[i + 1 :].strip(_WS):
                raise ValueError("content after the object")
            return len(buf)
        if g.sink is not None:
            self._emit(g.sink, "}" if g.obj else "]")
        self._place(stack[-1], g.value, g.start - self._base, i + 1)
        return i + 1

    # ---- complete values at once -----------------------------------------------------------------------------
    def _parse_run(self, buf: bytes, i: int, end: int) -> Any:
        """orjson.loads(buf[i:end]) as a list of values, nested as deep as they are (orjson's depth limit holds)."""
        depth = len(self._stack)
        vals = _loads(b"[" * depth + buf[i:end] + b"]" * depth)
        for _ in range(depth - 1):
            vals = vals[0]
        return vals

    def _elements(self, buf: bytes, i: int, f: _Frame) -> int:
        """Take every complete element from buf[i] on with one orjson call. Returns the end (i: none taken)."""
        closer = _OPEN.get(buf[i])
        for end in _candidates(buf, i, closer, b",]"):
            try:
                vals = self._parse_run(buf, i, end)
            except ValueError:
                continue
            if not vals:
                return i
            f.value.extend(vals)
            f.state = _NEXT
            if f.sink is not None:
                self._emit(f.sink, _dumps(vals).decode()[1:-1])
            return end
        return i

    def _whole(self, buf: bytes, i: int, f: _Frame, sink: Sink | None) -> int:
        """A container member value at buf[i], taken with one orjson call once it is complete. Returns its end,
        -(i + 1) to wait for more data, -2 to enter it (too large to keep waiting)."""
        n = len(buf)
        if f.obj:
            for end in _candidates(buf, i, _OPEN[buf[i]], b",}"):
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
    def _string(self, buf: bytes, i: int, f: _Frame, sink: Sink | None, head_string: bool) -> int:
        end = _string_end(buf, i + 1)
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
        end = _string_end(buf, i)
        stop = end if end >= 0 else _safe_cut(buf, i, len(buf))
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


def _candidates(buf: bytes, i: int, closer: int | None, follow: bytes) -> list[int]:
    """At most two places where a run of complete values from buf[i] may end, last first: after a closing bracket
    followed (maybe after whitespace) by one of `follow`; for scalars, at the last comma. (Single-byte rfind is
    memrchr; a few dozen brackets inside strings are stepped over.)"""
    if closer is None:
        c = buf.rfind(b",", i)
        return [c] if c > i else []
    out: list[int] = []
    n = len(buf)
    c = n
    for _ in range(32):
        c = buf.rfind(closer, i, c)
        if c < 0:
            break
        j = c + 1
        while j < n and buf[j] in _WS_SET:
            j += 1
        if j < n and buf[j] in follow:
            out.append(c + 1)
            if len(out) == 2:
                break
    return out


def _string_end(buf: bytes, s: int) -> int:
    """The index of the quote that closes a string whose content starts at buf[s] (at an escape boundary), or -1
    when it is not in buf. Raises ValueError for an invalid string."""
    k = buf.find(b'"', s)
    if k < 0:
        return -1
    if buf.find(b"\\", s, k) < 0:
        return k
    j = k
    while j > s and buf[j - 1] == 0x5C:
        j -= 1
    if not (k - j) & 1:
        return k
    # an escaped quote: let orjson find where the string ends, in a growing window
    n = len(buf)
    w = max(4096, 2 * (k - s))
    while True:
        stop = n if s + w >= n else _utf8_cut(buf, s, s + w)
        doc = b'"' + buf[s:stop]
        try:
            _loads(doc)
            return s + len(doc.rstrip(_WS)) - 2  # the string closed at the end of the window
        except _JSONError as e:
            if e.msg == "unexpected end of data":
                if stop >= n:
                    return -1
                w *= 2
                continue
            if e.msg != "unexpected content after document":
                raise
            pos = e.pos
            if not doc.isascii():
                pos = len(doc.decode("utf-8")[:pos].encode("utf-8"))
            return s + doc.rfind(b'"', 0, pos) - 1


def _utf8_cut(buf: bytes, lo: int, cut: int) -> int:
    """Move `cut` back so that buf[lo:cut] does not end inside a UTF-8 sequence."""
    k = cut - 1
    back = 0
    while k >= lo and back < 3 and 0x80 <= buf[k] < 0xC0:
        k -= 1
        back += 1
    if k >= lo and buf[k] >= 0xC0:
        need = 2 if buf[k] < 0xE0 else 3 if buf[k] < 0xF0 else 4
        if cut - k < need:
            return k
    return cut


def _safe_cut(buf: bytes, lo: int, hi: int) -> int:
    """Where to cut buf[lo:hi] (inside a string, lo at an escape boundary) so that the piece ends at an escape
    boundary, keeps a high surrogate with its low half, and ends on a whole UTF-8 sequence."""
    cut = hi
    b = buf.rfind(b"\\", max(lo, hi - 12), hi)
    if b >= 0:
        r = b  # the first backslash of b's run starts an escape: cut before it
        while r > lo and buf[r - 1] == 0x5C:
            r -= 1
        cut = r
        h = cut - 6  # a high-surrogate escape right before the cut stays with its pair
        if h >= lo and buf[h] == 0x5C and buf[h + 1] == 0x75 and buf[h + 2] in b"dD" and buf[h + 3] in b"89abAB":
            q = h
            while q > lo and buf[q - 1] == 0x5C:
                q -= 1
            if not (h - q) & 1:
                cut = h
    return _utf8_cut(buf, lo, cut)
