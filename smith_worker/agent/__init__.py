"""The agent loop and what it runs on: the per-turn context, one toolset per step, sub-agents, event batching."""
