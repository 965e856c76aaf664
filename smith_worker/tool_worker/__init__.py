"""The tool worker's side of a tool call: the ``run_tool`` job."""
