"""Tokenizing requests as the engine does: a local tokenizer built here with `tokenizers` (nothing downloaded),
the engine's /tokenize (modelsim, and a real HTTP server that misbehaves), and the character approximation."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from epp.request.parsing import parse_body
from epp.tokenize import (
    EngineTokenizer,
    LocalTokenizer,
    RequestTokenizer,
    TokenizeInput,
    TokenizerRegistry,
    approx_tokens,
    media_marker,
    tokenize_input,
)
from epp.tokenize.local import TokenizerLoadError
from modelsim import tokenizer as simtok
from modelsim.config import FleetConfig
from modelsim.fleet import Fleet
from scheduling.types import ApiKind
from tests.support.tiny_tokenizer import build_tokenizer


@pytest.fixture
def tokdir(tmp_path: Path) -> Path:
    return build_tokenizer(tmp_path / "acme" / "tiny-chat")


MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital"},
                                         {"type": "image_url", "image_url": {"url": "x"}},
                                         {"type": "text", "text": "of France?"}]}]
MARK = media_marker({"type": "image_url", "image_url": {"url": "x"}})  # the image's place (epp.tokenize.media)


# ---- local tokenizer -------------------------------------------------------------------------------------
def test_local_prompt_and_chat(tokdir: Path) -> None:
    tok = LocalTokenizer.from_dir(tokdir)
    ids = tok.encode_prompt("hello world")
    assert ids[0] == 0 and ids[1:] == tok.encode_prompt("hello world", add_special_tokens=False)
    req = tokenize_input(ApiKind.CHAT, {"messages": MESSAGES}, "tiny")
    text = tok.render_chat(req.messages)
    assert text == ("<s><|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    f"What is the capital\n{MARK}\nof France?<|im_end|>\n<|im_start|>assistant\n")
    chat = tok.encode_chat(req.messages)
    assert chat == tok.encode_prompt(text, add_special_tokens=False)
    assert chat.count(0) == 1  # the template's BOS only: no second one from the post-processor
    assert tok.tokenizer.decode(chat, skip_special_tokens=False).startswith("<s><|im_start|>system")
    no_gen = tok.render_chat(req.messages, add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")
    tools = tok.render_chat(req.messages, tools=[{"name": "f", "description": "é"}])
    assert '<|im_start|>tools\n[{"name": "f", "description": "é"}]' in tools  # tojson, ensure_ascii=False
    cont = tok.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Par"}],
                           add_generation_prompt=False, continue_final_message=True)
    assert cont.endswith("<|im_start|>assistant\nPar")


def test_template_forms_and_errors(tmp_path: Path) -> None:
    named = [{"name": "tool_use", "template": "TOOLS"}, {"name": "default", "template": "{{ bos_token }}X"}]
    t = LocalTokenizer.from_dir(build_tokenizer(tmp_path / "a", named, bos={"content": "<s>", "lstrip": False}))
    assert t.render_chat([{"role": "user", "content": "q"}]) == "<s>X"
    t = LocalTokenizer.from_dir(build_tokenizer(tmp_path / "b", "{{ raise_exception('no system role') }}"))
    with pytest.raises(ValueError, match="no system role"):
        t.encode_chat([{"role": "user", "content": "q"}])
    t = LocalTokenizer.from_dir(build_tokenizer(tmp_path / "c", "J{{ messages[0]['content'] }}", jinja_file=True))
    assert t.render_chat([{"role": "user", "content": "q"}]) == "Jq"
    t = LocalTokenizer.from_dir(build_tokenizer(tmp_path / "d", None))
    with pytest.raises(ValueError, match="no chat template"):
        t.encode_chat([{"role": "user", "content": "q"}])
    with pytest.raises(TokenizerLoadError, match="does not compile"):
        LocalTokenizer.from_dir(build_tokenizer(tmp_path / "e", "{% for %}"))
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="cannot load"):
        LocalTokenizer.from_dir(tmp_path / "f")


async def test_registry_lookup(tokdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reg = TokenizerRegistry(models={"alias": tokdir}, root=tmp_path)
    assert reg.get("acme/tiny-chat") is not None  # root/<model name>
    assert reg.loaded("alias") is None
    assert await reg.aget("alias") is not None and reg.loaded("alias") is not None
    assert reg.get("acme/other") is None and reg.get("../etc") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("nope")
    assert reg.get("broken") is None and "cannot load" in caplog.text
    assert reg.preload(["acme/tiny-chat", "missing"]) == {"acme/tiny-chat": True, "missing": False}


# ---- requests -> tokenizer input --------------------------------------------------------------------------
def test_tokenize_input_shapes() -> None:
    r = tokenize_input(ApiKind.COMPLETIONS, {"prompt": [[1, 2, 3]]}, "m")
    assert r.prompt_ids == (1, 2, 3)
    r = tokenize_input(ApiKind.COMPLETIONS, {"prompt": ["only one"]}, "sql-lora", "base", "only one")
    assert (r.prompt, r.model, r.request_model, r.approx_text) == ("only one", "base", "sql-lora", "only one")
    r = tokenize_input(ApiKind.RESPONSES, {"instructions": "Be brief.", "input": "Hi"}, "m")
    assert r.messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"})
    r = tokenize_input(ApiKind.RESPONSES, {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]}]}, "m")
    assert r.messages == ({"role": "user", "content": "a\nb"},)
    r = tokenize_input(ApiKind.MESSAGES, {"system": [{"type": "text", "text": "S"}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Q"}]}]}, "m")
    assert r.messages == ({"role": "system", "content": "S"}, {"role": "user", "content": "Q"})
    r = tokenize_input(ApiKind.CHAT, {"messages": MESSAGES, "tools": [{"t": 1}], "add_generation_prompt": False},
                       "m")
    assert r.tools == ({"t": 1},) and r.add_generation_prompt is False and r.is_chat


def test_approx_is_modelsims_byte_tokenizer() -> None:
    for text in ("", "abc", "abcd", "système ✓ 🚀 routers", '[{"role":"user","content":"hi"}]'):
        assert approx_tokens(text) == simtok.encode(text)


# ---- the engine's /tokenize --------------------------------------------------------------------------------
@pytest.fixture
async def fleet():
    from epp.stack.ports import free_port

    f = Fleet(FleetConfig(servers=1, base_port=free_port(), time_scale=0.05))
    await f.start()
    yield f
    await f.stop()


async def test_engine_tokenize_against_modelsim(fleet: Fleet) -> None:
    eng = EngineTokenizer()
    try:
        url = fleet.urls[0]
        model = fleet.config.model
        msgs = [{"role": "user", "content": "hello " * 10}]
        got = await eng.tokenize(url, model, messages=msgs)
        assert got == simtok.request_tokens(simtok.API_CHAT, {"messages": msgs})
        assert await eng.tokenize(url, model, prompt="abcdefgh") == simtok.encode("abcdefgh")
        assert (eng.hits, eng.misses) == (0, 2)
        assert await eng.tokenize(url, model, messages=msgs) == got and eng.hits == 1
        assert await eng.tokenize(url, "no-such-model", prompt="x") is None and eng.errors == {"http_404": 1}
    finally:
        await eng.close()


async def test_chat_prompt_text_approximation_matches_modelsim(fleet: Fleet) -> None:
    """Against modelsim the character approximation is exact: Pointsman's chat prompt text is the JSON that
    modelsim tokenizes."""
    body = {"model": fleet.config.model, "messages": [{"role": "user", "content": "Ünïcode and ascii " * 5}]}
    parsed = parse_body(ApiKind.CHAT, json.dumps(body).encode())
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[0]}/tokenize", json=body) as r:
            engine = (await r.json())["tokens"]
    assert approx_tokens(parsed.prompt) == engine


class Misbehaving:
    def __init__(self) -> None:
        self.hits = 0
        self.mode = "slow"
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.released = asyncio.Event()  # set when the server stops: a slow reply never comes before that

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.mode == "slow":
            await self.released.wait()
        if self.mode == "garbage":
            return web.Response(text='{"tokens": "no"}', content_type="application/json")
        return web.json_response({"count": 2, "max_model_len": 10, "tokens": [7, 8]})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/tokenize", self.handle)
        self.runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"


async def test_engine_timeout_backoff_and_bad_replies() -> None:
    srv = Misbehaving()
    url = await srv.start()
    now = [100.0]
    eng = EngineTokenizer(timeout=0.2, backoff=5.0, clock=lambda: now[0])
    try:
        t0 = asyncio.get_running_loop().time()
        assert await eng.tokenize(url, "m", prompt="a") is None
        assert asyncio.get_running_loop().time() - t0 < 1.0 and eng.errors == {"timeout": 1}
        assert not eng.usable(url)
        assert await eng.tokenize(url, "m", prompt="b") is None and srv.hits == 1  # backed off: no call
        now[0] += 5.0
        srv.mode = "garbage"
        assert await eng.tokenize(url, "m", prompt="c") is None and eng.errors["bad_reply"] == 1
        now[0] += 5.0
        srv.mode = "ok"
        assert await eng.tokenize(url, "m", prompt="d") == [7, 8]
        assert await eng.tokenize("http://127.0.0.1:9", "m", prompt="e") is None
        assert eng.errors["connection"] == 1
    finally:
        await eng.close()
        srv.released.set()
        await srv.runner.cleanup()


def test_engine_cache_is_bounded() -> None:
    eng = EngineTokenizer(cache_entries=3, cache_tokens=10)
    for i in range(5):
        eng._put(bytes([i]), [i] * 2)
    assert eng.cached == 3
    eng._put(b"big", list(range(9)))
    assert eng._cached_tokens <= 10 and eng._get(b"big") == list(range(9))
    eng._put(b"huge", list(range(11)))  # larger than the whole cache: not kept
    assert eng._get(b"huge") is None


# ---- the order of sources ----------------------------------------------------------------------------------
async def test_sources_in_order(tokdir: Path, tmp_path: Path, fleet: Fleet) -> None:
    registry = CollectorRegistry()
    reg = TokenizerRegistry(root=tmp_path)
    eng = EngineTokenizer()
    rt = RequestTokenizer(reg, eng, registry=registry)
    try:
        ids = TokenizeInput(model="x", request_model="x", prompt_ids=(5, 6))
        assert (await rt.tokenize(ids)).source == "prompt"
        local = tokenize_input(ApiKind.CHAT, {"messages": MESSAGES}, "acme/tiny-chat")
        res = await rt.tokenize(local, [fleet.urls[0]])
        assert res.source == "local" and res.tokens == LocalTokenizer.from_dir(tokdir).encode_chat(local.messages)
        model = fleet.config.model
        msgs = [{"role": "user", "content": "engine side"}]
        via_engine = tokenize_input(ApiKind.CHAT, {"messages": msgs}, model, prompt_text=json.dumps(msgs))
        res = await rt.tokenize(via_engine, [fleet.urls[0]])
        assert res.source == "engine" and "no local tokenizer" in res.detail
        assert res.tokens == simtok.request_tokens(simtok.API_CHAT, {"messages": msgs})
        approx = tokenize_input(ApiKind.COMPLETIONS, {"prompt": "plain"}, "unknown-model", prompt_text="plain")
        res = await rt.tokenize(approx, ["http://127.0.0.1:9"])
        assert res.source == "approx" and res.tokens == approx_tokens("plain") and "failed" in res.detail
        res = await rt.tokenize(approx, ["http://127.0.0.1:9"])  # backed off now: no second call
        assert res.source == "approx" and "no usable endpoint" in res.detail
        assert rt.tokenize_nowait(local).source == "local"
        assert rt.tokenize_nowait(via_engine).source == "approx"
        assert rt.counts == {"prompt": 1, "local": 2, "engine": 1, "approx": 3}
        assert registry.get_sample_value("pointsman_tokenize_requests_total", {"source": "approx"}) == 3
    finally:
        await eng.close()
