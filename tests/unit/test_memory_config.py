"""Declaring an agent's memory: the default and the check of the value."""

import pytest

from smith_client.errors import ConfigurationError
from smith_worker import FullMemory, RollingWindowMemory, SmithApp


def test_an_agent_takes_a_memory_and_defaults_to_full_memory():
    app = SmithApp()
    assert isinstance(app.agent("a").memory, FullMemory)
    window = RollingWindowMemory(max_messages=20)
    assert app.agent("b", memory=window).memory is window


def test_a_memory_that_is_not_a_memory_is_refused():
    with pytest.raises(ConfigurationError) as refused:
        SmithApp().agent("a", memory={"max_messages": 20})
    assert refused.value.setting == "memory"
