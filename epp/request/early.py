"""Reading the body as it streams in, and deciding before it ends: the rule (its flags and settings, `EarlySettings`,
are epp/request/settings.py's).

In FULL_DUPLEX_STREAMED (and STREAMED with `send_body_without_waiting_for_header_response`) the exchange reads each
request chunk as it arrives (epp/request/streaming.py), so the prompt is parsed by the time the last chunk comes.
It can also decide *early*, before the body ends, when everything the decision reads has arrived:

1. the model is known: a trusted header set by an earlier filter (`--trusted-model-header`, none by default: a
   client could set any header itself), the one model every endpoint of the only pool serves, or the body's
   top-level `model`, when it comes before the prompt;
2. the prompt's head covers what the scheduler hashes: every prefix producer's `blockSizeTokens × 4 ×
   maxPrefixBlocksToMatch` characters (16 KB for the defaults) of the head as the scheduler sees it (media
   payloads masked: a 16 KB data URL weighs its masked size, and a payload still arriving none), and with agent
   sessions the `programChars` (2,048) that tell a session's program, for the API kinds whose prompt starts with
   one member (chat `messages`, completions `prompt`, embeddings `input`, conversations `items`) (`head_needed`);
3. nothing else reads the whole body: no routes (`--routes-file`: a rule may match any field), no config that
   reads token ids (precise prefix routing tokenizes the whole prompt; `epp serve` always has a tokenizer ready,
   so what counts is whether a config of the scheduler reads them) or the whole prompt (a plugin that says
   `whole_prompt`: the byte-prefix-affinity scorer), no `x-gateway-model-name-rewrite` header, no
   InferenceModelRewrite for the pool unless the body's model has arrived (its value is rewritten in the chunks
   already received);
4. with agent sessions on, the session is named before the prompt (a session header, or a session body field that
   came first): agents carry it in `user`, `prompt_cache_key` or `metadata` after their messages, and a decision
   without it would route the turn as no session's. Otherwise the decision is made at the body's end, on the head,
   with the members after the prompt (below), at the same cost: the scan it then makes is the one the check makes.

What the decision cannot see is handled explicitly: the token estimate is the content-length's characters
(CHARS_PER_TOKEN per token; the prompt seen so far when there is none), the parsed body holds only the members that
had arrived (so `max_tokens` after the prompt is absent, and admitters use their defaults for it), a `cache_salt`
after the prompt is not in the block hashes, and the fields after the decision point are not validated (the model
server answers a malformed body). A prompt member that comes a second time after the decision point (JSON's last
one wins) is not seen by it: the decision stands on the first, the reader withdraws its head (`head_chars` 0).

OpenAI's Python client writes `messages` before `model`: its requests decide early only with a trusted model header
or a one-model pool. Otherwise, once the head is read (rules 2 and 3 hold and no InferenceModelRewrite could
apply), and likewise when rule 4 waits for a session, the rest of the body is kept unread (`Intake.late`), and when it ends one scan of it (`top_level`,
msgspec) reads its top-level members: the decision is then made on the head, as an early one is, with the body's
last `model` and every member after the prompt (so `max_tokens`, `user` and `cache_salt` are seen; the token
estimate is the body's size), and there is nothing left to check (`Intake.settle`). At 256 KB that costs 310 µs
in process where reading the whole body cost 780 (docs/performance.md). A body the scan refuses, or whose model is
not a non-empty string, is read on and parsed as before, so its client gets the same 400.

A decision that took its model from the body (rule 1's third case) is checked against the whole body: the model
server keeps JSON's last member, so a client could name one model before its prompt, for the decision and for
everything keyed on the model (rate limits, budgets, fairness, the routing headers), and another after it, for
the engine. The rest of such a body is kept (`Intake.rest`) and parsed once when it ends; a body that is not JSON
or whose top-level `model` is then another gets a 400 instead of its last chunk, so the engine never receives it
whole (`contradiction`). The check is one msgspec scan of the body that builds only its top-level model (about
60 µs at 256 KB); a model from a trusted header or a one-model pool needs none. A body Envoy sends whole (BUFFERED,
or one full-duplex message) is all there before its decision: the same scan, made at once, gives the decision the
model the engine serves (the last) and the members after the prompt, as for a model after the prompt
(`Intake.settle`); with an InferenceModelRewrite for the pool it checks the head's model instead, and a body that
contradicts it is read whole.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import orjson

from epp.request.context import MODEL_REWRITE
from epp.request.parsing import api_kind
from epp.request.streaming import COLLECT, HEAD, StreamingBody
from scheduling.prefix.precise_data import TOKEN_IDS
from scheduling.types import CHARS_PER_TOKEN, ApiKind

if TYPE_CHECKING:
    from epp.request.director import Director

log = logging.getLogger("epp.director")
SHOWN = 80  # characters of a client's value quoted in an error


HEAD_SLICE = 32 * 1024  # bytes of a long chunk read at a time while a decision may come from the prompt's head
HEAD_LEAD = 1024  # bytes before the prompt's head a first slice allows for (the model, the JSON around the prompt)
# scheduler -> (prompt characters its prefix producers hash, reads tokens, a plugin reads the whole prompt). Weak: a
# scheduler is immutable, and one that a config reload replaced must not lend its answer to the next one born at its
# address (a cache keyed by id() did: a reload could keep the old config's head length, or decide early for a config
# that reads tokens).
_NEEDS: weakref.WeakKeyDictionary[object, tuple[int, bool, bool]] = weakref.WeakKeyDictionary()


def _needs(scheduler: object) -> tuple[int, bool, bool]:
    got = _NEEDS.get(scheduler)
    if got is None:
        plugins = getattr(scheduler, "plugins", None)
        chars, whole = 0, False
        for p in plugins() if callable(plugins) else ():
            bt, mb = getattr(p, "block_tokens", None), getattr(p, "max_blocks", None)
            if isinstance(bt, int) and isinstance(mb, int):
                chars = max(chars, bt * CHARS_PER_TOKEN * mb)
            whole = whole or getattr(p, "whole_prompt", False) is True
        reads = getattr(scheduler, "reads", None)  # a ModelScheduler: any model's config
        if callable(reads):
            tokens = bool(reads(TOKEN_IDS))
        else:  # one ProfileScheduler
            producer = getattr(scheduler, "producer", None)
            tokens = callable(producer) and producer(TOKEN_IDS) is not None
        got = (chars, tokens, whole)
        try:
            _NEEDS[scheduler] = got
        except TypeError:  # an object without weak references (a test double) is measured every time
            pass
    return got


def prompt_chars_needed(scheduler: object) -> int:
    """The prompt characters a scheduler's prefix producers hash (0: it hashes none)."""
    return _needs(scheduler)[0]


def reads_tokens(scheduler: object) -> bool:
    """Whether a config of the scheduler reads the request's token ids (precise prefix routing: the whole prompt
    is tokenized, so its decision waits for the whole body)."""
    return _needs(scheduler)[1]


def reads_whole_prompt(scheduler: object) -> bool:
    """Whether a plugin of the scheduler reads the whole prompt (`whole_prompt`: the byte-prefix-affinity scorer
    hashes all of it), so its decision waits for the whole body."""
    return _needs(scheduler)[2]


def head_needed(d: Director, headers: Mapping[str, str]) -> int:
    """The prompt characters a decision on the head reads: what the scheduler's prefix producers hash, and the head
    that tells an agent session's program (`programChars`, 2,048) unless the program's header names it."""
    needed = prompt_chars_needed(d.scheduler)
    if d.sessions is not None:
        src = d.sessions.sources
        if not (src.program_header and headers.get(src.program_header)):
            needed = max(needed, src.program_chars)
    return needed


def pool_model(d: Director) -> str | None:
    """The one model every endpoint of the only pool serves, if that is the case."""
    ds = d.datastore
    names = ds.pool_names()
    if len(names) != 1:
        return None
    snap = ds.snapshot(names[0])
    if snap is None or not snap.endpoints:
        return None
    models = {tuple(e.models) for e in snap.endpoints}
    if len(models) != 1:
        return None
    only = next(iter(models))
    return only[0] if len(only) == 1 else None


def early_model(d: Director, headers: Mapping[str, str], body: StreamingBody) -> tuple[str, bool] | None:
    """The model an early decision can use and whether it came from the body (then the whole body must confirm
    it), or None (see the module docstring, rules 1 and 3)."""
    for name in d.early.model_headers:
        v = headers.get(name)
        if v:
            return v, False
    model = body.model
    if model:
        return model, True
    if d.datastore.rewrites:
        return None  # the rewrite would have to change a model value that has not arrived
    model = pool_model(d)
    return None if model is None else (model, False)


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])


def top_level(raw: bytes | memoryview, keep: Callable[[str], bool]) -> dict[str, Any]:
    """A whole body's top-level members that `keep` names, parsed, in one scan of the body: each key read as a JSON
    parser reads it (`"mod\\u0065l"` is `model`; the last of a name wins), and each value the caller does not keep
    only scanned, nothing of it built (msgspec: 60 against orjson's 73 µs for a whole parse of 256 KB of one plain
    string, 83 against 130 µs for 280 KB of 300 messages full of escapes; docs/performance.md). The kept values are
    parsed by orjson, as `parse_body` parses them. msgspec.DecodeError or ValueError for a body that is not a JSON
    object. The scan refuses malformed JSON as orjson does; in what it skips it takes invalid UTF-8 and numbers past
    a double's range, and such a body reaches the model server, whose own parser refuses the first (and takes the
    second). It nests only as deep as Python's stack allows: a body nested deeper is parsed whole by orjson, whose
    own limit (1,024 levels) decides, as before."""
    try:
        members = _TOP.decode(raw)
    except RecursionError:
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            raise msgspec.ValidationError("Expected `object`") from None
        return {k: v for k, v in body.items() if keep(k)}
    return {k: orjson.loads(memoryview(v)) for k, v in members.items() if keep(k)}


def contradiction(raw: bytes | memoryview, model: str) -> str | None:
    """What is wrong with a whole body whose decision read `model` in its head: it is not JSON, or its top-level
    `model` (JSON's last member, as the model server reads it) is another. None when it confirms the decision."""
    try:
        final = top_level(raw, "model".__eq__).get("model")
    except (msgspec.DecodeError, ValueError) as e:  # (a body that is not an object, too)
        return f"request body is not valid JSON: {e}"
    if final == model:
        return None
    shown = repr(final)
    shown = shown if len(shown) <= SHOWN else shown[:SHOWN] + "..."
    return (f"the request body names its model twice: {model[:SHOWN]!r} before the prompt, where the decision was "
            f"made, and {shown} at its end, which the model server would serve; send one top-level 'model'")


def may_decide_early(d: Director, headers: Mapping[str, str], kind: ApiKind) -> bool:
    """Whether a body of this kind may be decided on before it is all read (the rules but the head's size)."""
    return (d.early.decisions and kind in HEAD and d.router is None
            and (d.tokens is None or not reads_tokens(d.scheduler)) and not reads_whole_prompt(d.scheduler)
            and MODEL_REWRITE not in headers)


def head_ready(d: Director, headers: Mapping[str, str], body: StreamingBody) -> bool:
    """Whether the body has shown all the decision reads of its prompt, and may be decided on that (the rules but
    the model's)."""
    if not may_decide_early(d, headers, body.kind):
        return False
    needed = head_needed(d, headers)
    if body.size < needed:  # text takes a byte a character at least: a short body is left unread, so one that
        return False  # ends in its next message is still one orjson call (a head of small media masked longer than
        # its bytes waits for the body's end: an early decision is never owed, only allowed)
    if not body.reading:
        body.start()
    return body.head_chars >= needed and len(body.head_text()) >= needed  # masked media weighs less than base64


def ready(d: Director, headers: Mapping[str, str], body: StreamingBody) -> tuple[str, bool] | None:
    """The model to decide with now, before the body ends, and whether it came from the body; None while the
    decision must wait."""
    return early_model(d, headers, body) if head_ready(d, headers, body) else None


class Intake:
    """The request body as the exchange reads it while it streams in (full duplex), and whether the decision can be
    made before it ends: `early` is then the model to decide with (see the module docstring)."""

    __slots__ = ("reader", "early", "upto", "checks", "ended", "late")

    def __init__(self) -> None:
        self.reader: StreamingBody | None = None
        self.early: str | None = None
        self.upto = 0  # the body's bytes received when the early decision was made
        self.checks: str | None = None  # the early model came from the body: the whole body must confirm it
        self.ended = False  # the reader has the whole body
        self.late = False  # the head is read, the decision waits for what follows the prompt, unread (`settle`)

    def chunk(self, d: Director, headers: Mapping[str, str], data: bytes | memoryview, end_of_stream: bool) -> bool:
        """Read one chunk; True when the decision can be made now, before the body ends."""
        reader = self.reader
        if reader is None:
            reader = self.reader = StreamingBody(api_kind(headers))
        if len(data) > HEAD_SLICE and not reader.size and may_decide_early(d, headers, reader.kind):
            return self._head_first(d, headers, reader, data, end_of_stream)
        reader.feed(data, read=not self.late)
        if end_of_stream:
            self.ended = True
            self.settle(d)
            return False
        return not self.late and self._check(d, headers, reader)

    def _check(self, d: Director, headers: Mapping[str, str], reader: StreamingBody) -> bool:
        rewrites = bool(d.datastore.rewrites)
        try:
            head = head_ready(d, headers, reader)
            got = early_model(d, headers, reader) if head else None
            if got is not None and got[1] and not rewrites and (self.ended or (
                    d.sessions is not None and d.sessions.pending(headers, reader.partial()))):
                # The body has ended (one scan gives the model the engine serves, the last, and the members after
                # the prompt, where a check would give the model alone), or its session may be named after the
                # prompt (`user`, as agents send it): decided at the end, on the head (`settle`).
                got = None
        except Exception:  # never crash a stream: decide at the end instead
            log.exception("early decision check failed")
            head, got = False, None
        self.early, self.checks = (None, None) if got is None else (got[0], got[0] if got[1] else None)
        self.upto = reader.size
        # The head is all here and the decision waits for what follows the prompt: the model (OpenAI's Python client
        # writes it there), the session, or, once the body has ended, its other members. The rest is kept unread;
        # the decision comes at the end (`settle`).
        self.late = head and got is None and not rewrites
        return self.early is not None

    def settle(self, d: Director) -> None:
        """The body has ended after a head that waited for what follows the prompt (`late`): one scan of the whole
        body reads its top-level members (`top_level`), they join those the reader read, and the decision is made on
        the head as an early one is, with the body's last model and nothing left to check. A body the scan refuses, or whose
        model is not a non-empty string, is read on and parsed as before (`StreamingBody.finish`), for the exact
        result or error; so is one whose pool gained a model rewrite (it rewrites a model value it must see)."""
        reader = self.reader
        if not self.late or reader is None:
            return
        self.late = False
        if d.datastore.rewrites:
            return
        prompt = COLLECT.get(reader.kind, frozenset())  # what the decision reads of them is the head
        try:
            members = top_level(reader.raw(), lambda name: name not in prompt)
        except (msgspec.DecodeError, ValueError):
            return
        model = members.get("model")
        if not isinstance(model, str) or not model:
            return
        reader.complete(members)
        self.early = model
        self.upto = reader.size

    def rewritten(self, target: str) -> bytes | None:
        """The body received up to the early decision with its top-level model's value rewritten to `target` (a
        model rewrite decided before the body ended; the chunks after it pass as they are); None when that value
        had not arrived."""
        reader = self.reader
        return None if reader is None else reader.rewritten_prefix(target, self.upto)

    def rest(self, data: bytes | memoryview, end_of_stream: bool) -> str | None:
        """A chunk after an early decision: kept while the decision's model came from the body; at the body's end,
        what contradicts the decision in the whole body (`contradiction`), or None."""
        model, reader = self.checks, self.reader
        if model is None or reader is None:
            return None
        reader.feed(data, read=False)
        if not end_of_stream:
            return None
        self.checks = None
        return contradiction(reader.raw(), model)

    def _head_first(self, d: Director, headers: Mapping[str, str], reader: StreamingBody,
                    data: bytes | memoryview, end_of_stream: bool) -> bool:
        """A long first chunk (a long body Envoy sends in one message, the last one included) is read a slice at a
        time while the decision may still come from its head: what follows the head is then never parsed. The first
        slice is the shortest that can hold the head (the characters the scheduler hashes and HEAD_LEAD before
        them: 17 KB for the defaults, where a 32 KB slice cost a third more), the next ones HEAD_SLICE. Once the
        head is long enough and the decision still cannot come from it (the model comes after the prompt; media
        masked shorter than its base64) or no head began in the first HEAD_SLICE bytes, the chunk is kept whole
        again, as any first chunk is (a whole body is then one orjson call)."""
        reader.feed(data, read=False)
        self.ended = end_of_stream
        needed = head_needed(d, headers)
        step = needed + HEAD_LEAD  # the least that can hold the head: a character is a byte at least
        while reader.read < reader.size:
            reader.start(reader.read + step)
            step = HEAD_SLICE
            if self._check(d, headers, reader):
                if not end_of_stream:
                    return True
                # At the end the machine decides now, on the head. A model read from the body is checked against the
                # whole of it here only with a model rewrite for the pool (which rewrites the value the head read;
                # else `_check` leaves the decision to `settle`): confirmed, it stands; else the body is read whole.
                if self.checks is None or contradiction(reader.raw(), self.checks) is None:
                    self.checks = None
                    return False
                self.early = self.checks = None
                break
            if self.late:  # the model comes after the prompt (or the body has ended): the rest waits unread
                if not end_of_stream:
                    return False
                self.settle(d)
                if self.early is not None:
                    return False
                break  # (a body the scan could not decide: read whole, for the exact error)
            if reader.head_chars >= needed or (not reader.head_chars and reader.read >= HEAD_SLICE):
                break
        if reader.read < reader.size:
            self.reader = whole = StreamingBody(reader.kind)
            whole.feed(data)
            if not end_of_stream:
                return self._check(d, headers, whole)
        return False

    @classmethod
    def whole(cls, d: Director, headers: Mapping[str, str], body: bytes | memoryview | None) -> Intake | None:
        """A long body Envoy sent whole (BUFFERED) is read as a long first chunk is: when the decision can come from
        the prompt's head, an Intake holding that head; else None (the body is parsed whole, as before)."""
        if body is None or len(body) <= HEAD_SLICE or not may_decide_early(d, headers, api_kind(headers)):
            return None
        intake = cls()
        intake.chunk(d, headers, body, True)
        return intake if intake.early is not None else None

    @classmethod
    def for_decision(cls, intake: Intake | None, d: Director, headers: Mapping[str, str],
                     body: bytes | memoryview | None
                     ) -> tuple[Intake | None, bytes | memoryview | StreamingBody | None, int]:
        """What the decision reads of the body: the intake that read it as it streamed in, or as far as the head of
        a long body Envoy sent whole (None: the body as Envoy sent it), that body and its size."""
        intake = intake or cls.whole(d, headers, body)
        if intake is None:
            return None, body, sent_size(headers, body)
        intake.settle(d)  # (a body whose end came in trailers: no last chunk said so)
        return (intake, *intake.body(headers, body))

    def body(self, headers: Mapping[str, str], body: bytes | memoryview | None
             ) -> tuple[bytes | memoryview | StreamingBody | None, int]:
        """What the decision reads (the body read as it streamed in or as far as its head, or the one Envoy sent
        whole) and its size."""
        reader = self.reader
        if reader is not None and (body is None or self.early is not None):
            if not self.ended and self.early is None:
                self.ended = True  # (a reader that was never told the end: the machine decides at the end)
            return reader, reader.size if self.early is None else max(content_length(headers), reader.size)
        self.reader = self.early = None
        return body, sent_size(headers, body)


def sent_size(headers: Mapping[str, str], body: bytes | memoryview | None) -> int:
    """The size of a body as Envoy sent it: its length, or the content-length while it has not come."""
    return len(body) if body else content_length(headers)


def content_length(headers: Mapping[str, str]) -> int:
    try:
        return max(0, int(headers.get("content-length", "0")))
    except ValueError:
        return 0
