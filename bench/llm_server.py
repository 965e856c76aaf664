"""The scripted chat-completions server of ``make bench``, in its own process (no GIL shared with a client).

Runs :class:`smith_worker.testing.ScriptedLlmServer` with the fixed
scenarios below, prints its base URL on the first line of stdout and serves
until stdin closes. Every scenario answers streamed and non-streamed requests.

Prompts (``PROMPTS[name]``; the marker routes the request):

* ``text``: a 7-word reply;
* ``tool``: a call to ``add(1, 2)``, then ``RESULT: 3`` (two model requests);
* ``noop``: a call to ``noop()``, then ``done``;
* ``tokens``: 50 content deltas of 4 characters, 20 ms apart (token latency);
* ``slow``: 100 deltas 30 ms apart, ~3 s (keeps turns in flight for the RSS figure);
* ``wait2s``: a short text whose four frames after the first (one content delta, the finish, the usage, ``[DONE]``)
  come 0.5 s apart: a slow hosted model, 2 s per response (``bench/in_flight.py``).

Usage: ``python -m bench.llm_server`` (the worker and anchor processes get the URL).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smith_worker.testing import Reply, Script, ScriptedLlmServer, scenario_marker  # noqa: E402

TOKENS = 50  # token deltas per ``tokens`` stream
SCENARIOS = {
    "text": Reply.text("ECHO: hello there, how are you today", chunk_size=5),
    "tool": Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("RESULT: 3")),
    "noop": Script(Reply.tool_calls([("noop", {})]), Reply.text("done")),
    "tokens": Reply.text("tok " * TOKENS, chunk_size=4, delay=0.02),
    "slow": Reply.text("slow " * 100, chunk_size=5, delay=0.03),
    "wait2s": Reply.text("a slow model's short answer", chunk_size=100, delay=0.5),
}
PROMPTS = {name: f"{scenario_marker(name)} hello there, how are you today" for name in SCENARIOS}


def main() -> None:
    with ScriptedLlmServer() as server:
        for name, reply in SCENARIOS.items():
            server.add_scenario(name, reply)
        print(server.base_url, flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin (or dies)


if __name__ == "__main__":
    main()
