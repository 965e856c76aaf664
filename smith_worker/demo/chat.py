"""``make chat``: the REPL on the demo app, with everything it needs started and stopped.

Starts what ``make demo`` starts (Redis unless ``SMITH_REDIS_URL`` answers,
the embedded model unless ``SMITH_LLM_BASE_URL`` is set, a turn and a tool
worker serving :mod:`smith_worker.demo`: calculator, read_local_file, write_local_file and
the bundled MCP example server), then runs :class:`~smith_client.repl.ChatRepl`
on the demo's ``chat`` agent, which lets the model choose its tools (``make
demo``'s ``default`` agent forces the calculator instead): tokens to stdout,
tool status lines to stderr; ``/reset``, ``/exit``, Ctrl-D, and Ctrl-C to
cancel a running turn. A write_local_file call waits for the person's ``y``/``n``
(the tool needs approval): ``y`` writes the file, ``n`` gives the model the
rejection. Child logs go to ``.demo-logs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from smith_client import SmithClient
from smith_client.cli import StreamPrinter
from smith_client.repl import ChatRepl
from smith_worker.demo import CHAT_AGENT
from smith_worker.demo.run import one_line_errors, start_services


async def _chat(redis_url: str, prefix: str) -> int:
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        return await ChatRepl(client, StreamPrinter(), agent=CHAT_AGENT).run()


def main() -> int:
    """Run the REPL until /exit or Ctrl-D; everything started is stopped on the way out."""
    with contextlib.ExitStack() as stack:
        redis_url, prefix, _ = start_services(stack, Path(".demo-logs"))
        return asyncio.run(_chat(redis_url, prefix))


if __name__ == "__main__":
    raise SystemExit(one_line_errors("make chat", main))
