"""The tool worker's side of a tool call: its role (queue, job, sync-tool pools) and the ``run_tool`` job."""
