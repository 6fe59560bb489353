"""Prefix hash chain micro-benchmark (not a test): µs to hash one prompt into its approximate prefix blocks.

Chains, timed interleaved (one of each per round, thread CPU clock, median of the rounds):
- "xxh64 ‖ le64" the previous chain, block_i = xxh64(chunk_i ‖ le64(block_{i-1})): a slice, a pack, a
  concatenation and a call per block;
- "xxh3 seeded": block_i = xxh3_64(chunk_i, seed=block_{i-1}), cut by slicing: a slice and a call per block;
- "block_hashes": scheduling.prefix.block_hashes (the same xxh3 chain; an ASCII prompt is cut by one struct
  unpack per 256 blocks, so one call per block);
- "streaming": StreamingBlockHasher fed the prompt in 1 KB pieces, then finish() (the same chain).
Prompts of 16 KB and 256 KB, ASCII and not (a mix with accented and CJK characters), hashed up to the default 256
blocks (a decision never hashes more) and in full (every block of the prompt).

    python bench/bench_hashing.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import random
import statistics
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduling.prefix import StreamingBlockHasher, block_hashes, chain_seed  # noqa: E402

STEP = 64  # characters per block (16 tokens × 4)
PIECE = 1024  # characters per streamed piece

Chain = Callable[[str, int], object]


def xxh64_packed(prompt: str, max_blocks: int) -> list[int]:
    h, pack = xxhash.xxh64_intdigest, struct.Struct("<Q").pack
    text = prompt[: STEP * max_blocks]
    prev = h(b"llama")
    if text.isascii():
        data = text.encode("ascii")
        return [prev := h(data[i : i + STEP] + pack(prev)) for i in range(0, len(data), STEP)]
    return [prev := h(text[i : i + STEP].encode("utf-8") + pack(prev)) for i in range(0, len(text), STEP)]


def xxh3_sliced(prompt: str, max_blocks: int) -> list[int]:
    h = xxhash.xxh3_64_intdigest
    text = prompt[: STEP * max_blocks]
    prev = chain_seed("llama")
    if text.isascii():
        data = text.encode("ascii")
        return [prev := h(data[i : i + STEP], prev) for i in range(0, len(data), STEP)]
    return [prev := h(text[i : i + STEP].encode("utf-8"), prev) for i in range(0, len(text), STEP)]


def current(prompt: str, max_blocks: int) -> list[int]:
    return block_hashes(prompt, "llama", max_blocks=max_blocks)


_pieces: dict[str, list[str]] = {}


def pieces(prompt: str) -> list[str]:
    """The prompt as it arrives: PIECE-character pieces (cut once, outside the timing)."""
    got = _pieces.get(prompt)
    if got is None:
        got = _pieces[prompt] = [prompt[i : i + PIECE] for i in range(0, len(prompt), PIECE)]
    return got


def streaming(prompt: str, max_blocks: int) -> list[int]:
    sh = StreamingBlockHasher("llama", max_blocks=max_blocks)
    feed = sh.feed
    for piece in _pieces[prompt]:
        feed(piece)
    return sh.finish()


CHAINS: dict[str, Callable[[str, int], list[int]]] = {
    "xxh64 ‖ le64 (before)": xxh64_packed,
    "xxh3 seeded, sliced": xxh3_sliced,
    "block_hashes (after)": current,
    "streaming, 1 KB pieces": streaming,
}


def prompt(chars: int, ascii_only: bool, rnd: random.Random) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz ,.\n" if ascii_only else "abcdefghij ,.éàü系统提示词"
    return "".join(rnd.choice(alphabet) for _ in range(chars))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    rnd = random.Random(1)
    print(f"python {sys.version.split()[0]}; thread CPU clock; median of {args.rounds} interleaved rounds; µs per prompt\n")
    cases = []
    for chars in (16 * 1024, 256 * 1024):
        for ascii_only in (True, False):
            text = prompt(chars, ascii_only, rnd)
            for max_blocks in sorted({256, -(-chars // STEP)}):
                cases.append((f"{chars // 1024} KB {'ASCII' if ascii_only else 'mixed'}", max_blocks, text))
    names = list(CHAINS)
    print("| prompt | blocks | " + " | ".join(names) + " | before / after |")
    print("|---|---:|" + "---:|" * len(names) + "---:|")
    for label, max_blocks, text in cases:
        pieces(text)
        assert current(text, max_blocks) == streaming(text, max_blocks)
        times: dict[str, list[int]] = {n: [] for n in names}
        for _ in range(args.rounds):
            for n in names:
                fn = CHAINS[n]
                t0 = time.thread_time_ns()
                fn(text, max_blocks)
                times[n].append(time.thread_time_ns() - t0)
        med = {n: statistics.median(ts) / 1000 for n, ts in times.items()}
        blocks = min(max_blocks, -(-len(text) // STEP))
        cells = " | ".join(f"{med[n]:.1f}" for n in names)
        ratio = med["xxh64 ‖ le64 (before)"] / med["block_hashes (after)"]
        print(f"| {label} | {blocks} | {cells} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
