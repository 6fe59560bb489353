"""API kind from the path, model and prompt extraction, and clear 400s for bad bodies."""

from __future__ import annotations

import orjson
import pytest

from epp.request.parsing import api_kind, parse_body, set_model
from scheduling.types import ApiKind, ErrorCode, SchedulingError


@pytest.mark.parametrize(
    ("headers", "kind"),
    [
        ({":path": "/v1/chat/completions"}, ApiKind.CHAT),
        ({":path": "/v1/completions?x=1"}, ApiKind.COMPLETIONS),
        ({":path": "/v1/embeddings"}, ApiKind.EMBEDDINGS),
        ({":path": "/v1/responses"}, ApiKind.RESPONSES),
        ({":path": "/v1/messages"}, ApiKind.MESSAGES),
        ({":path": "/v1/conversations"}, ApiKind.CONVERSATIONS),
        ({":path": "/v1/models"}, ApiKind.OTHER),
        ({"x-original-path": "/openai/v1/chat/completions"}, ApiKind.CHAT),
        ({"x-forwarded-path": "/v1/messages"}, ApiKind.MESSAGES),
        ({":path": "/rewritten", "x-original-path": "/v1/completions"}, ApiKind.OTHER),
    ],
)
def test_api_kind_from_path(headers, kind):
    assert api_kind(headers) is kind


def _err(kind: ApiKind, body: bytes) -> SchedulingError:
    with pytest.raises(SchedulingError) as e:
        parse_body(kind, body)
    assert e.value.code is ErrorCode.BAD_REQUEST
    return e.value


def test_bad_bodies_give_clear_messages():
    assert "not valid JSON" in str(_err(ApiKind.CHAT, b"{nope"))
    assert str(_err(ApiKind.CHAT, b'{"messages":[1]}')) == "inference error: BadRequest - model not found in request body"
    assert "JSON object" in str(_err(ApiKind.CHAT, b"[1,2]"))
    assert "at least 1 message" in str(_err(ApiKind.CHAT, b'{"model":"m","messages":[]}'))
    assert "'prompt'" in str(_err(ApiKind.COMPLETIONS, b'{"model":"m"}'))
    assert "'input'" in str(_err(ApiKind.EMBEDDINGS, b'{"model":"m","input":""}'))
    assert "'input'" in str(_err(ApiKind.RESPONSES, b'{"model":"m"}'))
    assert "'messages'" in str(_err(ApiKind.MESSAGES, b'{"model":"m","system":"s"}'))
    assert "must be a string" in str(_err(ApiKind.CHAT, b'{"model":5,"messages":[{}]}'))


def test_prompt_extraction_per_kind():
    msgs = [{"role": "user", "content": "hi"}]
    p = parse_body(ApiKind.CHAT, orjson.dumps({"model": "m", "messages": msgs}))
    assert p.model == "m" and p.prompt == orjson.dumps(msgs).decode()
    assert parse_body(ApiKind.COMPLETIONS, b'{"model":"m","prompt":"abc"}').prompt == "abc"
    assert parse_body(ApiKind.EMBEDDINGS, b'{"model":"m","input":["a","b"]}').prompt == '["a","b"]'
    r = parse_body(ApiKind.RESPONSES, b'{"model":"m","instructions":"be nice","input":"q"}')
    assert r.prompt == "be niceq"
    a = parse_body(ApiKind.MESSAGES, orjson.dumps({"model": "c", "system": "S", "messages": msgs, "max_tokens": 5}))
    assert a.prompt.startswith("S") and a.prompt.endswith(orjson.dumps(msgs).decode())


def test_same_system_prompt_gives_same_prompt_prefix():
    sys_msg = {"role": "system", "content": "You are a helpful assistant. " * 20}
    a = parse_body(ApiKind.CHAT, orjson.dumps({"model": "m", "messages": [sys_msg, {"role": "user", "content": "a"}]}))
    b = parse_body(ApiKind.CHAT, orjson.dumps({"model": "m", "messages": [sys_msg, {"role": "user", "content": "b"}]}))
    common = len(orjson.dumps([sys_msg]).decode()) - 1
    assert a.prompt[:common] == b.prompt[:common]


def test_set_model_rewrites_only_the_model():
    body = {"model": "a", "messages": [{"role": "user", "content": "x"}]}
    assert orjson.loads(set_model(body, "b")) == {**body, "model": "b"}
