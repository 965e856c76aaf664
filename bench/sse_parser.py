"""SSE line assembly: CPU time to parse a large answer, as one line and as many small frames.

Feeds :class:`smith_worker.llm.sse.SseParser` the bytes an HTTP client would
hand it (``--chunk`` bytes per read, httpx's 64 KiB by default):

* ``one line``: one ``data:`` line of ``--mb`` MiB (a server that sends a
  whole answer in one frame);
* ``1 KiB frames``: the same bytes as ``data:`` frames of 1 KiB.

With ``--compare FILE`` the same runs use the parser class of another copy of
``sse.py`` (e.g. the version before the linear-time change, from ``git show``).

Usage: ``.venv/bin/python bench/sse_parser.py [--mb 8] [--compare /tmp/sse_before.py]``
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smith_worker.llm.sse import SseParser  # noqa: E402


def one_line(size: int) -> bytes:
    return b"data: " + b"x" * size + b"\n\n"


def small_frames(size: int, frame: int = 1024) -> bytes:
    return (b"data: " + b"x" * frame + b"\n\n") * (size // frame)


def parse_cpu(parser_cls: type, stream: bytes, chunk: int) -> tuple[float, int]:
    """CPU seconds to feed ``stream`` in ``chunk``-byte pieces, and the number of events."""
    parser = parser_cls()
    events = 0
    view = memoryview(stream)
    started = time.process_time()
    for start in range(0, len(stream), chunk):
        events += len(parser.feed(bytes(view[start:start + chunk])))
    return time.process_time() - started, events


def load_parser(path: str) -> type:
    spec = importlib.util.spec_from_file_location("sse_compare", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.SseParser


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=8.0, help="answer size in MiB")
    ap.add_argument("--chunk", type=int, default=65536, help="bytes per read")
    ap.add_argument("--compare", help="another sse.py to run side by side")
    args = ap.parse_args()
    size = int(args.mb * 1024 * 1024)
    parsers = [("current", SseParser)] + ([("compare", load_parser(args.compare))] if args.compare else [])
    print(f"{args.mb:g} MiB answer, {args.chunk} B reads")
    for label, stream in (("one line", one_line(size)), ("1 KiB frames", small_frames(size))):
        for name, cls in parsers:
            cpu, events = parse_cpu(cls, stream, args.chunk)
            print(f"  {label:<13} {name:<8} {cpu:8.3f} s CPU  {size / cpu / 1e6 if cpu else 0:8.1f} MB/s  ({events} events)")


if __name__ == "__main__":
    main()
