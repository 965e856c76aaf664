"""The demo app: two agents over ``calculator``, ``read_local_file`` and the
tools of the bundled MCP example server (``mcp_example__echo``, ``mcp_example__now``);
the ``chat`` agent has ``write_local_file`` too.

* ``default`` (``make demo``, ``smith ask``, ``make web``) forces the calculator on its
  first model call: the small local model (SmolLM2-135M) rarely picks the right tool by
  itself but gives schema-valid arguments for a named ``tool_choice``, so "What is
  17*23?" comes out as 391.
* ``chat`` (:data:`CHAT_AGENT`, ``make chat``) lets the model choose
  (``tool_choice="auto"``), so it can read or write a file or call the MCP tools; the 135M
  model often picks the wrong tool or arguments (``SMITH_LLM_BASE_URL`` selects another).
  ``write_local_file`` needs a person's approval (``needs_approval=True``): the REPL asks
  y/n before each write (docs/architecture.md, Pausing for a person). ``default`` does not
  offer it, so ``make demo``'s forced calculator turn never waits for a person.

After one tool round both answer with ``tool_choice="none"``.

Run it with ``smith-worker smith_worker.demo:app --queue turns`` and
``--queue tools``, then ``smith ask "What is 17*23?"`` (or ``smith --agent chat chat``).
The sandbox of ``read_local_file`` and ``write_local_file`` is ``SMITH_DEMO_FS`` or the
``demo_fs`` folder beside this file. With the embedded server the workers use
``SMITH_LLM_TOOL_CALLING=json_schema`` (set by the launcher, see
:meth:`smith_worker.local.llm_server.LocalModelServer.client_env`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from smith_worker.app import SmithApp
from smith_worker.demo.calculator import evaluate
from smith_worker.demo.files import DEMO_SANDBOX
from smith_worker.demo.files import read_local_file as _read_local_file
from smith_worker.demo.files import write_local_file as _write_local_file

app = SmithApp()

#: The agent ``make chat`` talks to: the model chooses its tools.
CHAT_AGENT = "chat"


@app.tool(timeout=5.0, idempotent=True)
def calculator(expression: str) -> int | float:
    """Evaluate an arithmetic expression with + - * / ^ and parentheses, e.g. "17*23"."""
    return evaluate(expression)


def _sandbox() -> Path:
    return Path(os.environ.get("SMITH_DEMO_FS") or DEMO_SANDBOX)


@app.tool(timeout=5.0, idempotent=True)
def read_local_file(path: str) -> str:
    """Read a UTF-8 text file from the demo sandbox directory, by relative path (e.g. "README.txt")."""
    return _read_local_file(path, _sandbox())


# Writing the same content again changes nothing: safe to re-run after a tool worker died.
@app.tool(timeout=5.0, idempotent=True, needs_approval=True)
def write_local_file(path: str, content: str) -> str:
    """Write a UTF-8 text file into the demo sandbox directory, by relative path (e.g. "notes.txt")."""
    written = _write_local_file(path, content, _sandbox())
    return f"wrote {written} bytes to {path}"


# The bundled MCP example server: its tools reach the model as mcp_example__echo and
# mcp_example__now; each worker process starts it on first use and pools it. The synthetic
# resource reader is left out (allow list): with its longer description in the prompt, the
# 135M demo model's forced calculator arguments came out with a raw control character.
app.mcp_server(
    "example",
    command=sys.executable,
    args=[str(Path(__file__).with_name("mcp_server_example.py"))],
    allow=["echo", "now"],
)


# Both agents share the prompt, the tools, greedy decoding (the 135M model's sampled tool
# arguments sometimes carry raw control characters) and one tool round per turn; they differ
# only in the first call's tool_choice.
_demo_agent = functools.partial(
    app.agent,
    system_prompt=(
        "You are a helpful assistant. Use the calculator tool for arithmetic and "
        "read_local_file to read files. After a tool result, answer briefly with the result."
    ),
    tools=[calculator, read_local_file],
    sources=["example"],
    llm={"default_sampling": {"temperature": 0.0}},
    # After a tool result the 135M model, offered tools again, calls more of them until the turn's
    # max_iterations (16) ends it; "none" makes it answer with the result.
    tool_choice_after_tools="none",
)
# make demo's agent: its scripted question "What is 17*23?" needs the forced calculator (module doc).
_demo_agent("default", tool_choice="calculator")
# make chat's agent: the model chooses, so the file tools and the MCP tools can be used; a write waits for a
# person's y/n.
_demo_agent(
    CHAT_AGENT,
    system_prompt=(
        "You are a helpful assistant. Use the calculator tool for arithmetic, read_local_file to read files "
        "and write_local_file to write files. After a tool result, answer briefly with the result."
    ),
    tools=[calculator, read_local_file, write_local_file],
    tool_choice="auto",
)
