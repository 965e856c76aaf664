"""Loop and LLM-client defaults are the seed's (§15.1 ``AgentConfig``, §8.1 ``LlmClientConfig``, §6.3)."""

import pytest

from smith_client.errors import ConfigurationError
from smith_worker.config import AgentConfig, Settings
from smith_worker.llm import LlmClientConfig


def test_agent_config_defaults_are_the_seeds():
    cfg = AgentConfig()
    assert (cfg.max_iterations, cfg.tree_max_iterations, cfg.deadline, cfg.max_total_tokens) == (16, 50, None, None)
    assert cfg.default_tool_timeout == 30.0  # seconds
    assert cfg.tool_result_max_bytes == 64 * 1024 and cfg.stream_default is True


def test_llm_client_config_defaults_are_the_seeds():
    cfg = LlmClientConfig(base_url="http://127.0.0.1:8080/v1", model="m")
    assert cfg.api_key is None and cfg.request_timeout == 60.0 and cfg.max_retries == 3
    assert (cfg.backoff_base, cfg.max_retry_after, cfg.include_usage) == (0.5, 60.0, True)


def test_history_max_messages_defaults_to_10000_and_reads_the_environment(monkeypatch):
    assert Settings.from_env().history_max_messages == 10_000
    monkeypatch.setenv("SMITH_HISTORY_MAX_MESSAGES", "500")
    assert Settings.from_env().history_max_messages == 500


def test_tool_calling_and_temperature_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SMITH_LLM_TOOL_CALLING", "json_schema")
    monkeypatch.setenv("SMITH_LLM_TEMPERATURE", "0")
    config = Settings.from_env().llm_config()
    assert config.tool_calling == "json_schema" and config.default_sampling.temperature == 0.0
    assert Settings.from_env().llm_config({"tool_calling": "native"}).tool_calling == "native"  # an agent's override wins
    monkeypatch.delenv("SMITH_LLM_TEMPERATURE")
    assert Settings.from_env().llm_config().default_sampling.temperature is None
    monkeypatch.setenv("SMITH_LLM_TOOL_CALLING", "grammar")
    with pytest.raises(ConfigurationError):
        Settings.from_env().llm_config()
