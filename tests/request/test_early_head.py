"""A long body that comes in one message is read only as far as the decision needs (issue 32): the prompt's head,
a slice at a time (`epp.request.early.HEAD_SLICE`), when the decision can come from it; the whole body, as before,
when it cannot (the model after the prompt, a head that never begins)."""

from __future__ import annotations

import orjson
import pytest

from epp.protocol import BodyMode
from epp.request.early import HEAD_SLICE
from epp.request.parsing import parse_body
from scheduling.types import ApiKind
from tests.support.extproc import SyncMachine, body_msg, headers_msg, real_director, set_headers

DEST = "x-gateway-destination-endpoint"


def chat(model_first: bool, chars: int = 256_000) -> bytes:
    text = ("what the agent saw so far, turn after turn; " * (chars // 44 + 1))[:chars]
    messages = [{"role": "user", "content": text}]
    body = {"model": "m", "messages": messages, "max_tokens": 7} if model_first else \
        {"messages": messages, "model": "m", "max_tokens": 7}
    return orjson.dumps(body)


def decide(raw: bytes, pieces: int = 1, mode: BodyMode = BodyMode.FULL_DUPLEX_STREAMED):
    director = real_director()
    ex = director.exchange()
    m = SyncMachine(ex, request_body_mode=mode)
    m.feed(headers_msg())
    size = -(-len(raw) // pieces)
    replies = []
    for i in range(0, len(raw), size):
        replies += m.feed(body_msg(raw[i : i + size], i + size >= len(raw)))
    return ex, replies


def destination(replies) -> bytes | None:
    for r in replies:  # the routing headers ride on the headers reply, or on the body's in BUFFERED
        phase = r.WhichOneof("response")
        if phase in ("request_headers", "request_body") and DEST in set_headers(r, phase):
            return set_headers(r, phase)[DEST]
    return None


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED])
def test_a_long_body_in_one_message_is_read_only_as_far_as_its_head(mode: BodyMode) -> None:
    raw = chat(model_first=True)
    ex, replies = decide(raw, mode=mode)
    reader = ex.intake.reader if ex.intake is not None else None
    assert reader is not None and ex.early == "m"
    assert reader.read <= 2 * HEAD_SLICE < len(raw)  # the rest of the body was never parsed
    req = ex.ctx.request if ex.ctx is not None else None
    whole = parse_body(ApiKind.CHAT, raw)
    assert req is not None and whole.prompt.startswith(req.prompt) and len(req.prompt) >= 16_384
    assert destination(replies) is not None
    ex.close()


@pytest.mark.parametrize("mode", [BodyMode.FULL_DUPLEX_STREAMED, BodyMode.BUFFERED])
def test_the_model_after_the_prompt_reads_the_whole_body_as_before(mode: BodyMode) -> None:
    """No early decision can come from the head (the model has not arrived): the body is kept whole again and
    parsed at its end as one orjson call, the prompt the whole one."""
    raw = chat(model_first=False)
    ex, replies = decide(raw, mode=mode)
    assert ex.early is None
    req = ex.ctx.request if ex.ctx is not None else None
    assert req is not None and req.prompt == parse_body(ApiKind.CHAT, raw).prompt
    assert destination(replies) is not None
    ex.close()


@pytest.mark.parametrize(("pieces", "mode"), [(1, BodyMode.FULL_DUPLEX_STREAMED), (3, BodyMode.FULL_DUPLEX_STREAMED),
                                              (1, BodyMode.BUFFERED)])
def test_the_head_decides_where_the_whole_body_would(pieces: int, mode: BodyMode) -> None:
    """On the same (idle) pool, the decision made on the head of a long body picks the endpoint the whole body's
    decision picks (read as it streamed in, in one message, or sent whole)."""
    raw = chat(model_first=True)
    early_ex, early = decide(raw, pieces, mode)
    late_ex, late = decide(chat(model_first=False), pieces, mode)
    assert early_ex.early is not None and late_ex.early is None
    assert destination(early) == destination(late) is not None
    early_ex.close()
    late_ex.close()


def test_a_short_body_in_one_message_is_parsed_whole() -> None:
    raw = chat(model_first=True, chars=HEAD_SLICE // 2)
    ex, _ = decide(raw)
    reader = ex.intake.reader if ex.intake is not None else None
    assert ex.early is None and reader is not None and not reader.reading  # one orjson call at the end
    ex.close()
