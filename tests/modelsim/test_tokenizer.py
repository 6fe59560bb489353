from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from modelsim import tokenizer as tk


@given(st.text())
def test_roundtrip_and_count(text: str) -> None:
    toks = tk.encode(text)
    assert tk.decode(toks) == text.rstrip("\0")
    assert all(0 <= t < 2**32 for t in toks)
    assert len(toks) == tk.count_tokens(text) == -(-len(text.encode()) // 4)


def test_four_bytes_per_token_and_64_char_blocks() -> None:
    a = "x" * 64 + "tail-a"
    b = "x" * 64 + "tail-b"
    assert tk.encode(a)[:16] == tk.encode(b)[:16]
    assert tk.block_texts(a) == ["x" * 64]


def test_partial_chunk_is_nul_padded_and_ascii_ids_fit_in_31_bits() -> None:
    assert tk.encode("abcdab") == [0x61626364, 0x61620000]
    assert all(t < 2**31 for t in tk.encode("~" * 37))


def test_chat_prompt_text_is_compact_json_of_messages() -> None:
    msgs = [{"role": "system", "content": "Sé brief"}, {"role": "user", "content": "hi"}]
    text = tk.prompt_text(tk.API_CHAT, {"messages": msgs})
    assert text == json.dumps(msgs, ensure_ascii=False, separators=(",", ":"))
    assert text.startswith('[{"role":"system","content":"Sé brief"}')


def test_anthropic_system_becomes_first_message() -> None:
    body = {"system": "S", "messages": [{"role": "user", "content": "q"}]}
    assert tk.prompt_text(tk.API_MESSAGES, body) == '[{"role":"system","content":"S"},{"role":"user","content":"q"}]'


def test_completion_token_ids_pass_through() -> None:
    assert tk.request_tokens(tk.API_COMPLETIONS, {"prompt": [1, 2, 3]}) == [1, 2, 3]
    assert tk.request_tokens(tk.API_COMPLETIONS, {"prompt": [[4, 5]]}) == [4, 5]
    assert tk.request_tokens(tk.API_COMPLETIONS, {"prompt": "abcd"}) == tk.encode("abcd")
