"""SSE parse throughput: the project's parser vs httpx-sse and the openai SDK's decoder (part e of ``make bench``).

Every contestant parses the same recorded-shape ~8 MB chat-completions stream
body (25,480 frames of ~330 B in OpenAI's compact chunk shape, 8 % of the
content deltas non-ASCII or escaped) and decodes the JSON of every frame but
``[DONE]``, fed two ways: 64 KiB reads (httpx's read size) and one frame per
read. Best of ``--runs`` runs each (wall time), the project's side and the
anchors' taking turns in ``--rounds`` rounds.

* ``smith SseParser + orjson``: :class:`smith_worker.llm.sse.SseParser`, then
  ``orjson.loads`` of each data (the project's worker path, minus assembly);
* ``smith ChatStreamDecoder``: parser + assembly into stream events (for
  reference: it does more than the anchors);
* the anchors, run with the anchors' own interpreter (``bench/anchor_env.py``)
  in a subprocess on the same bytes file in the same run:
  ``httpx-sse + json`` (its ``SSELineDecoder`` + ``SSEDecoder`` fed from an
  incremental UTF-8 decoder, as ``iter_sse`` does, then ``sse.json()``),
  ``httpx-sse + orjson`` (the same, ``orjson.loads(sse.data)``) and
  ``openai SSEDecoder`` (``iter_bytes`` then ``sse.json()``, the path inside
  the SDK's ``Stream``);
* ``smith, one 8 MiB line``: a single ``data:`` line of the body's size in
  64 KiB reads, no JSON — shows the parser stays linear on huge lines.

Target 5 of ``make bench``: the project's parser ≥ 2× httpx-sse + json and ≥ 1× httpx-sse + orjson, both chunkings.

Usage: ``.venv/bin/python bench/sse_parser.py [--runs 15] [--rounds 3] [--json PATH]`` (exit 0; PASS/MISS printed).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

READ_SIZE = 65536
FRAMES = 25_480
CHUNKINGS = ("64 KiB reads", "frame per read")
PROJECT = "smith SseParser + orjson"
HTTPX_JSON = "httpx-sse + json"
HTTPX_ORJSON = "httpx-sse + orjson"
DONE = "[DONE]"

_WORDS = ["the", "model", "answer", "stream", "token", "agent", "tool", "call", "of", "and", "a", "to", "in"]
_UNUSUAL = ["é", "—", "日本語", "😀", "\n", '"quoted"', "naïve", "\\"]


def make_body(frames: int = FRAMES, seed: int = 18) -> bytes:
    """A chat-completions stream body in OpenAI's compact chunk shape, the same bytes for a given seed."""
    rng = random.Random(seed)

    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
        payload = {
            "id": "chatcmpl-CZ1Qm8x3Yb7uTq2wLrVn5KpHs9Df",
            "object": "chat.completion.chunk",
            "created": 1764633600,
            "model": "gpt-4o-mini-2024-07-18",
            "service_tier": "default",
            "system_fingerprint": "fp_560af6e559",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
            "obfuscation": "".join(
                rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", k=rng.randint(2, 12))
            ),
        }
        return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": "", "refusal": None})]
    for _ in range(frames - 3):
        word = rng.choice(_UNUSUAL) if rng.random() < 0.08 else rng.choice(_WORDS)[: rng.randint(1, 8)]
        parts.append(chunk({"content": " " + word}))
    parts.append(chunk({}, finish="stop"))
    parts.append(b"data: " + DONE.encode() + b"\n\n")
    return b"".join(parts)


def chunkings(body: bytes) -> dict[str, list[bytes]]:
    """The body as 64 KiB reads and as one frame (``data: ...\\n\\n``) per read."""
    frames = [frame + b"\n\n" for frame in body.split(b"\n\n")[:-1]]
    assert b"".join(frames) == body
    return {
        CHUNKINGS[0]: [body[start : start + READ_SIZE] for start in range(0, len(body), READ_SIZE)],
        CHUNKINGS[1]: frames,
    }


# -- contestants: each parses the chunks, decodes every JSON frame and returns how many --


def smith_parser(chunks: list[bytes]) -> int:
    import orjson

    from smith_worker.llm.sse import SseParser

    loads = orjson.loads
    parser = SseParser()
    decoded = 0
    for chunk in chunks:
        for _, data, _, _ in parser.iter_feed(chunk):
            if data != DONE:
                loads(data)
                decoded += 1
    return decoded


def smith_decoder(chunks: list[bytes]) -> int:
    from smith_worker.llm.stream import ChatStreamDecoder

    decoder = ChatStreamDecoder()
    for chunk in chunks:
        for _ in decoder.feed(chunk):
            pass
    decoder.finish()
    return decoder.frames - 1  # [DONE] is a frame, not JSON


def _httpx_sse_events(chunks: list[bytes]) -> Iterator[Any]:
    import codecs

    from httpx_sse._decoders import SSEDecoder, SSELineDecoder

    text = codecs.getincrementaldecoder("utf-8")()
    lines, events = SSELineDecoder(), SSEDecoder()
    for chunk in chunks:
        for line in lines.decode(text.decode(chunk)):
            event = events.decode(line.rstrip("\n"))
            if event is not None:
                yield event


def httpx_sse_json(chunks: list[bytes]) -> int:
    decoded = 0
    for event in _httpx_sse_events(chunks):
        if event.data != DONE:
            event.json()
            decoded += 1
    return decoded


def httpx_sse_orjson(chunks: list[bytes]) -> int:
    import orjson

    loads = orjson.loads
    decoded = 0
    for event in _httpx_sse_events(chunks):
        if event.data != DONE:
            loads(event.data)
            decoded += 1
    return decoded


def openai_decoder(chunks: list[bytes]) -> int:
    from openai._streaming import SSEDecoder

    decoded = 0
    for event in SSEDecoder().iter_bytes(iter(chunks)):
        if not event.data.startswith(DONE):  # as openai.Stream does
            event.json()
            decoded += 1
    return decoded


def smith_one_line(chunks: list[bytes]) -> int:
    from smith_worker.llm.sse import SseParser

    parser = SseParser()
    return sum(len(parser.feed(chunk)) for chunk in chunks)


PROJECT_SIDE: dict[str, Callable[[list[bytes]], int]] = {
    PROJECT: smith_parser,
    "smith ChatStreamDecoder": smith_decoder,
}
ANCHOR_SIDE: dict[str, Callable[[list[bytes]], int]] = {
    HTTPX_JSON: httpx_sse_json,
    HTTPX_ORJSON: httpx_sse_orjson,
    "openai SSEDecoder": openai_decoder,
}


def best_seconds(contestant: Callable[[list[bytes]], int], chunks: list[bytes], runs: int) -> tuple[float, int]:
    """Fastest of ``runs`` wall-clock runs (seconds) and the number of frames decoded."""
    best, decoded = float("inf"), 0
    for _ in range(runs):
        started = time.perf_counter()
        decoded = contestant(chunks)
        best = min(best, time.perf_counter() - started)
    return best, decoded


def measure(side: dict[str, Callable[[list[bytes]], int]], body: bytes, runs: int) -> list[dict[str, Any]]:
    """One row per contestant and chunking: MB/s (10^6 bytes of body per second) and frames decoded."""
    rows = []
    for chunking, chunks in chunkings(body).items():
        for name, contestant in side.items():
            seconds, decoded = best_seconds(contestant, chunks, runs)
            rows.append(
                {"contestant": name, "chunking": chunking, "mb_s": len(body) / seconds / 1e6, "frames": decoded}
            )
    return rows


def anchor_rows(body_path: Path, runs: int) -> list[dict[str, Any]]:
    """The anchors' rows, measured by this script under the anchors' interpreter (``.bench-venv``)."""
    sys.path.insert(0, str(ROOT))
    from bench.anchor_env import anchor_python

    result = subprocess.run(
        [str(anchor_python()), __file__, "--anchor-side", str(body_path), "--runs", str(runs)],
        check=True,
        capture_output=True,
        text=True,
    )
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows


def interleaved(body: bytes, runs: int, rounds: int) -> list[dict[str, Any]]:
    """Both sides measured in ``rounds`` alternating rounds of ``runs / rounds`` runs; the best round counts.

    On a shared machine a burst of load then slows both sides, not only the one that happened to run then.
    """
    best: dict[tuple[str, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        body_path = Path(scratch) / "body.sse"
        body_path.write_bytes(body)
        for _ in range(rounds):
            per_round = max(1, runs // rounds)
            for row in measure(PROJECT_SIDE, body, per_round) + anchor_rows(body_path, per_round):
                key = row["contestant"], row["chunking"]
                if key not in best or row["mb_s"] > best[key]["mb_s"]:
                    best[key] = row
    return list(best.values())


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Target 5 of ``make bench``, per chunking and anchor: the project's MB/s over the anchor's vs the target."""
    rate = {(row["contestant"], row["chunking"]): row["mb_s"] for row in rows}
    lines = []
    for chunking in CHUNKINGS:
        for anchor, target in ((HTTPX_JSON, 2.0), (HTTPX_ORJSON, 1.0)):
            ratio = rate[PROJECT, chunking] / rate[anchor, chunking]
            lines.append(
                {"chunking": chunking, "anchor": anchor, "target": target, "ratio": ratio, "pass": ratio >= target}
            )
    return lines


def one_line_row(size: int) -> dict[str, Any]:
    """The project's parser on one ``data:`` line of ``size`` bytes in 64 KiB reads (no JSON): linear time."""
    stream = b"data: " + b"x" * size + b"\n\n"
    chunks = [stream[start : start + READ_SIZE] for start in range(0, len(stream), READ_SIZE)]
    seconds, _ = best_seconds(smith_one_line, chunks, 5)
    name = f"smith, one {size / 2**20:.0f} MiB line (no JSON)"
    return {"contestant": name, "chunking": CHUNKINGS[0], "mb_s": size / seconds / 1e6, "frames": 1}


def print_table(rows: list[dict[str, Any]]) -> None:
    """Adds the ratios to ``rows`` and prints them, grouped by chunking."""
    rate = {(row["contestant"], row["chunking"]): row["mb_s"] for row in rows}
    print(f"{'contestant':<34} {'chunking':<15} {'MB/s':>8} {'vs httpx-sse+json':>18} {'vs httpx-sse+orjson':>20}")
    for row in sorted(rows, key=lambda row: CHUNKINGS.index(row["chunking"])):
        mb_s, chunking = row["mb_s"], row["chunking"]
        row["vs_httpx_sse_json"] = mb_s / rate[HTTPX_JSON, chunking]
        row["vs_httpx_sse_orjson"] = mb_s / rate[HTTPX_ORJSON, chunking]
        ratios = f"{row['vs_httpx_sse_json']:17.2f}x {row['vs_httpx_sse_orjson']:19.2f}x"
        print(f"{row['contestant']:<34} {chunking:<15} {mb_s:8.1f} {ratios}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="runs per contestant and chunking; the best counts")
    ap.add_argument("--rounds", type=int, default=3, help="alternate the two sides this many times (noise hits both)")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--anchor-side", type=Path, help=argparse.SUPPRESS)  # internal: measure the anchors on this body
    args = ap.parse_args()
    if args.anchor_side:
        print(json.dumps(measure(ANCHOR_SIDE, args.anchor_side.read_bytes(), args.runs)))
        return
    sys.path.insert(0, str(ROOT))
    body = make_body()
    rows = interleaved(body, args.runs, args.rounds)
    decoded = {row["frames"] for row in rows}
    assert decoded == {FRAMES - 1}, f"contestants decoded different frame counts: {decoded}"
    rows.append(one_line_row(len(body)))

    print(
        f"SSE parse, {len(body):,} B body, {FRAMES:,} frames, JSON decoded; best of {args.runs} runs; MB/s = 10^6 B/s"
    )
    print_table(rows)
    lines = verdicts(rows)
    for line in lines:
        verdict = "PASS" if line["pass"] else "MISS"
        target = f"smith ≥ {line['target']:g}x {line['anchor']}: {line['ratio']:.2f}x"
        print(f"{verdict}  acceptance 5, {line['chunking']}: {target}")
    if args.json:
        figures = {"body_bytes": len(body), "frames": FRAMES, "runs": args.runs, "rows": rows, "acceptance": lines}
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
