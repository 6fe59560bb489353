r"""The deterministic byte-level tokenizer shared by modelsim and the picker.

Pure: no I/O, no global state, standard library only, so the picker may import it.

Scheme
------
1. The *prompt text* of a request is built by `prompt_text(api, body)`:

   * ``completions``: the ``prompt`` string. A list of strings is joined with ``""``. A list of ints (or a
     list holding one list of ints) is already token ids and is used as is (see `request_tokens`).
   * ``chat`` (``/v1/chat/completions``): ``json.dumps(body["messages"], ensure_ascii=False,
     separators=(",", ":"))``; keys keep the order in which the client sent them.
   * ``messages`` (Anthropic ``/v1/messages``): the same JSON serialization of a list made of
     ``{"role": "system", "content": body["system"]}`` (only when ``system`` is present) followed by
     ``body["messages"]``.
   * ``responses``: ``instructions`` (if any) followed by ``input`` when it is a string, or the JSON
     serialization above of ``input`` when it is a list.
   * ``embeddings``: ``input`` as for completions.

2. The prompt text is encoded as UTF-8 and cut into chunks of 4 bytes. Each chunk is one token:
   ``int.from_bytes(chunk.ljust(4, b"\0"), "big")``, i.e. the last chunk, when shorter than 4 bytes, is
   padded with NUL bytes. Ids fit in 32 bits (below 2**31 for ASCII text), like a real vocabulary's, so
   routers that validate token ids accept them. `decode` drops trailing NULs (text ending in NUL
   characters does not round-trip; nothing else is lost).

3. Media (vLLM-like). In chat, Anthropic messages and responses bodies, a content part that is an image, audio,
   video or file (``image_url``, ``input_audio``, ``video_url``, ``audio_url``, ``file``, ``image``,
   ``document``, ``input_image``, ``input_file``) is not text: the prompt text is cut where the part stands
   (the JSON around it keeps ``{"type": <kind>}``), each piece is encoded on its own, and the item becomes
   `MM_TOKENS` placeholder tokens (`PLACEHOLDER`), as a vision encoder's output stands in vLLM's prompt. Its
   *mm hash* (`mm_hash`: the item's content reference hashed with modelsim's own function, as vLLM hashes the
   processed pixels with its own) goes with it: `request_inputs` returns the tokens and the items as
   ``(offset, length, mm_hash)``; the KV cache mixes the hashes into the blocks the placeholders overlap and
   publishes them as those blocks' ``extra_keys``. A request without media is tokenized exactly as before.

So ``ceil(len(utf8) / 4)`` tokens per prompt (text only); with a KV block size of 16 tokens one block covers 64
bytes (64 characters for ASCII), matching the picker's approximate prefix scorer (4 characters per token,
64-character blocks).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any

BYTES_PER_TOKEN = 4

API_CHAT = "chat"
API_COMPLETIONS = "completions"
API_MESSAGES = "messages"
API_RESPONSES = "responses"
API_EMBEDDINGS = "embeddings"

MM_TOKENS = 256  # placeholder tokens per media item
PLACEHOLDER = 0xFFFF0001  # the placeholder token id (no UTF-8 text encodes to it)
_MEDIA = {"image_url": "image_url", "input_audio": "input_audio", "video_url": "video_url", "audio_url": "audio_url",
          "file": "file", "image": "source", "document": "source", "input_image": "image_url",
          "input_file": "file_data"}
_CUT = "\ue000"  # where a media part stands in the prompt text while it is cut
MMItem = tuple[int, int, str]  # (offset, length, mm hash)


def encode(text: str) -> list[int]:
    """Token ids of `text` (4 UTF-8 bytes per token)."""
    data = text.encode("utf-8")
    rem = len(data) % BYTES_PER_TOKEN
    if rem:
        data += b"\0" * (BYTES_PER_TOKEN - rem)
    return list(struct.unpack(f">{len(data) // BYTES_PER_TOKEN}I", data))


def decode(tokens: Iterable[int]) -> str:
    """Inverse of `encode` up to trailing NULs (invalid UTF-8 sequences are replaced)."""
    data = b"".join((t & 0xFFFFFFFF).to_bytes(BYTES_PER_TOKEN, "big") for t in tokens)
    return data.rstrip(b"\0").decode("utf-8", errors="replace")


def count_tokens(text: str) -> int:
    """Number of tokens `encode(text)` would return."""
    n = len(text.encode("utf-8"))
    return -(-n // BYTES_PER_TOKEN)


def messages_json(messages: Any) -> str:
    """The canonical serialization of a chat `messages` list."""
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":"))


def _text_of_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "".join(prompt)
    return ""


def prompt_text(api: str, body: Mapping[str, Any]) -> str:
    """The text that is tokenized for a request body of the given API (see the module docstring)."""
    if api == API_CHAT:
        return messages_json(body.get("messages", []))
    if api == API_MESSAGES:
        msgs: list[Any] = []
        if body.get("system") is not None:
            msgs.append({"role": "system", "content": body["system"]})
        msgs.extend(body.get("messages", []))
        return messages_json(msgs)
    if api == API_RESPONSES:
        inp = body.get("input", "")
        text = inp if isinstance(inp, str) else messages_json(inp)
        instr = body.get("instructions")
        return (instr + text) if isinstance(instr, str) else text
    if api in (API_COMPLETIONS, API_EMBEDDINGS):
        return _text_of_prompt(body.get("prompt" if api == API_COMPLETIONS else "input", ""))
    raise ValueError(f"unknown api {api!r}; expected one of chat, completions, messages, responses, embeddings")


def _token_id_prompt(prompt: Any) -> list[int] | None:
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        return _token_id_prompt(prompt[0])
    return None


def request_tokens(api: str, body: Mapping[str, Any]) -> list[int]:
    """Token ids of a request body: pre-tokenized prompts are passed through, text is `encode`d."""
    if api in (API_COMPLETIONS, API_EMBEDDINGS):
        ids = _token_id_prompt(body.get("prompt" if api == API_COMPLETIONS else "input"))
        if ids is not None:
            return ids
    return encode(prompt_text(api, body))


def mm_hash(ref: object) -> str:
    """modelsim's hash of a media item's content (the engine's own; a router cannot know it)."""
    return hashlib.blake2b(json.dumps(ref, sort_keys=True).encode(), digest_size=16, person=b"modelsim-mm").hexdigest()


def _strip_media(value: Any, refs: list[Any]) -> Any:
    """`value` with each media part replaced by a cut mark (its content appended to `refs`)."""
    if isinstance(value, list):
        return [_strip_media(v, refs) for v in value]
    if isinstance(value, dict):
        kind = value.get("type")
        if isinstance(kind, str) and kind in _MEDIA:
            refs.append(value.get("uuid") or value.get(_MEDIA[kind]) or value)
            return {"type": kind, "media": _CUT}
        return {k: _strip_media(v, refs) for k, v in value.items()}
    return value


def request_inputs(api: str, body: Mapping[str, Any]) -> tuple[list[int], tuple[MMItem, ...]]:
    """Token ids of a request body and its media items (see the module docstring, 3.)."""
    if api not in (API_CHAT, API_MESSAGES, API_RESPONSES):
        return request_tokens(api, body), ()
    refs: list[Any] = []
    stripped = {k: _strip_media(v, refs) if k in ("messages", "input", "system") else v for k, v in body.items()}
    if not refs:
        return request_tokens(api, body), ()
    pieces = prompt_text(api, stripped).split(_CUT)
    tokens: list[int] = []
    items: list[MMItem] = []
    for i, piece in enumerate(pieces):
        tokens += encode(piece) if piece else []
        if i < len(refs):
            items.append((len(tokens), MM_TOKENS, mm_hash(refs[i])))
            tokens += [PLACEHOLDER] * MM_TOKENS
    return tokens, tuple(items)


def block_texts(text: str, block_size: int = 16) -> list[str]:
    """Split `text` the way full KV blocks cover it (only meaningful for ASCII text): 4*block_size chars."""
    step = BYTES_PER_TOKEN * block_size
    return [text[i : i + step] for i in range(0, len(text) - len(text) % step, step)]

