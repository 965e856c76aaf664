"""Tools: function tools, the tool-source protocol and the app's native source, isolation pools, and the
turn side's waiter for tool results."""
