"""Testing your agents: a scripted chat-completions model and real worker processes around it.

A test writes what the model answers, step by step, then runs the app's real
workers against that model and a private Redis, and drives them with the
ordinary client::

    from smith_worker.testing import Reply, Script, ScriptedLlmServer, scenario_marker

    with ScriptedLlmServer() as model:
        model.add_scenario("adds", Script(
            Reply.tool_calls([("add", {"a": 2, "b": 3})]),  # the first model call of the turn
            Reply.text("2 + 3 = 5"),                         # after the tool result
        ))
        ...  # workers started with worker_env(redis_url, prefix, model.base_url)
        ...  # client.send(f"{scenario_marker('adds')} What is 2+3?", ...)

The parts:

* :class:`ScriptedLlmServer`, :class:`Reply`, :class:`Script`,
  :func:`scenario_marker`, :class:`RecordedRequest` and friends: the model
  (:mod:`smith_worker.testing.scripted_llm` describes scenarios, steps, the
  reply shapes and the wire format);
* :func:`worker_env`, :func:`start_workers`, :func:`wait_for_workers`,
  :func:`worker_pair`: worker processes serving an app
  (:mod:`smith_worker.testing.workers`);
* :func:`start_redis_server`: a private, diskless ``redis-server`` on a free
  port (from :mod:`smith_worker.local.processes`);
* :class:`smith_worker.testing.otlp.OtlpReceiver`: an OTLP/HTTP receiver collecting the spans of traced workers
  (imported from its module: it needs ``opentelemetry-proto``, in the dev extra).

Product code never imports this package (an import-linter contract keeps it so).
"""

from smith_worker.local.processes import ManagedProcess, start_redis_server
from smith_worker.testing.scripted_llm import (
    DONE_FRAME,
    Handler,
    RecordedRequest,
    Reply,
    RequestLimit,
    Script,
    ScriptedLlmServer,
    WirePlan,
    native_tool_fields,
    scenario_marker,
    sse_frame,
    without_native_tools,
)
from smith_worker.testing.workers import SCRIPTED_MODEL, start_workers, wait_for_workers, worker_env, worker_pair

__all__ = [
    "DONE_FRAME",
    "SCRIPTED_MODEL",
    "Handler",
    "ManagedProcess",
    "RecordedRequest",
    "Reply",
    "RequestLimit",
    "Script",
    "ScriptedLlmServer",
    "WirePlan",
    "native_tool_fields",
    "scenario_marker",
    "sse_frame",
    "start_redis_server",
    "start_workers",
    "wait_for_workers",
    "without_native_tools",
    "worker_env",
    "worker_pair",
]
