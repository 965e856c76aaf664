"""README's "Testing your agents": its example is examples/testing/test_agents.py, letter for letter, and it passes."""

from __future__ import annotations

import re

import pytest

from examples.testing import test_agents
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration]

EXAMPLE = ROOT / "examples" / "testing" / "test_agents.py"


def readme_example() -> str:
    """The first Python block of the README's "Testing your agents" section."""
    section = (ROOT / "README.md").read_text().split("## Testing your agents\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no Python block in README's Testing your agents"
    return match.group(1)


def test_the_readme_shows_the_example_file():
    assert readme_example() == EXAMPLE.read_text()


async def test_the_example_passes(tmp_path):
    await test_agents.test_the_agent_adds_with_its_tool(tmp_path)
