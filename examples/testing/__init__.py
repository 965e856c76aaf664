"""Testing an agent with ``smith_worker.testing`` (README, "Testing your agents")."""
