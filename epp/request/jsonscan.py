"""Byte scanning for the streaming JSON reader (jsonstream.py): where strings and runs of values may end, and where
a long string may be cut. Stateless; single-byte `find`/`rfind` (memchr, memrchr) do the per-byte work, and orjson
is asked only where a string has backslashes before its candidate end.
"""

from __future__ import annotations

import orjson

WS = b" \t\n\r"
WS_SET = frozenset(WS)
OPEN = {0x7B: 0x7D, 0x5B: 0x5D}  # { -> }, [ -> ]
_loads = orjson.loads
_JSONError = orjson.JSONDecodeError


def candidates(buf: bytes, i: int, closer: int | None, follow: bytes) -> list[int]:
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
        while j < n and buf[j] in WS_SET:
            j += 1
        if j < n and buf[j] in follow:
            out.append(c + 1)
            if len(out) == 2:
                break
    return out


def string_end(buf: bytes, s: int) -> int:
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
        stop = n if s + w >= n else utf8_cut(buf, s, s + w)
        doc = b'"' + buf[s:stop]
        try:
            _loads(doc)
            return s + len(doc.rstrip(WS)) - 2  # the string closed at the end of the window
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


def utf8_cut(buf: bytes, lo: int, cut: int) -> int:
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


def safe_cut(buf: bytes, lo: int, hi: int) -> int:
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
    return utf8_cut(buf, lo, cut)
