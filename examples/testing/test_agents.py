from smith_client import SmithClient
from smith_worker.testing import (
    Reply,
    Script,
    ScriptedLlmServer,
    scenario_marker,
    start_redis_server,
    worker_env,
    worker_pair,
)


async def test_the_agent_adds_with_its_tool(tmp_path):
    redis, redis_url = start_redis_server(log_path=tmp_path / "redis.log")  # private, on a free port
    try:
        with ScriptedLlmServer() as model:
            model.add_scenario("adds", Script(
                Reply.tool_calls([("add", {"a": 2, "b": 3})], ids=["call_1"]),  # the turn's first model call
                Reply.text("2 + 3 = 5"),                                        # the next, after the tool ran
            ))
            env = worker_env(redis_url, "t1", model.base_url)  # SMITH_REDIS_URL, SMITH_PREFIX, SMITH_LLM_BASE_URL
            async with worker_pair("examples.testing.agents:app", redis_url, "t1", env, log_dir=tmp_path):
                async with SmithClient.from_url(redis_url, prefix="t1") as client:
                    prompt = f"{scenario_marker('adds')} What is 2+3?"  # the marker picks the scenario
                    reply = await client.send(prompt, conversation_id="c1", timeout=30)
    finally:
        redis.stop()
    assert reply.content == "2 + 3 = 5"
    first, second = model.requests_for("adds")
    assert [tool["function"]["name"] for tool in first.body["tools"]] == ["add"]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}
