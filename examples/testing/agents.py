"""The app under test in the README's example (``examples.testing.agents:app``): one agent, one tool."""

from smith_worker import SmithApp

app = SmithApp()


@app.tool(timeout=5.0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


app.agent("default", system_prompt="You are helpful.", tools=[add])
