"""The app of tests/integration/test_caller_context.py: a typed caller context (docs/architecture.md, Caller context).

Its tools answer digests of what they saw, never the values, so a model request can be checked for
the context's values; ``leaky`` returns and logs the secret, which the worker must redact.
"""

from __future__ import annotations

import hashlib
import logging
import time

from pydantic import BaseModel, SecretStr

from smith_worker import SmithApp
from smith_worker.hooks import HookContext, Hooks
from smith_worker.skills import Skill
from smith_worker.tools.function import ToolContext


class Caller(BaseModel):
    """Who sent the turn."""

    user_id: str
    tenant: str = "acme"
    api_token: SecretStr


app = SmithApp(context_type=Caller)
app_logger = logging.getLogger("agent_smith.context_app")


def digest(value: str) -> str:
    """The digest a tool answers for ``value`` (the test computes it alike)."""
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _seen(ctx: ToolContext) -> dict[str, str]:
    caller = ctx.context
    return {
        "type": type(caller).__name__,
        "user": digest(caller.user_id) if isinstance(caller, Caller) else "",
        "token": digest(caller.api_token.get_secret_value()) if isinstance(caller, Caller) else "",
        "agent": ctx.agent,
    }


@app.tool
def whose(ctx: ToolContext) -> dict[str, str]:
    """Digests of the caller context this tool sees."""
    return _seen(ctx)


@app.tool
def whose_slowly(seconds: float, ctx: ToolContext) -> dict[str, str]:
    """As ``whose``, after ``seconds``."""
    time.sleep(seconds)
    return _seen(ctx)


@app.tool
def leaky(ctx: ToolContext) -> str:
    """Logs and returns the caller's token (the worker redacts it from both)."""
    token = ctx.context.api_token.get_secret_value()
    ctx.logger.warning("leaky tool: token=%s", token)
    return f"the token is {token}"


def _on_tool_result(message: object, ctx: HookContext | None) -> None:
    """A two-parameter hook: gets the turn's context; logs the secret (redacted by the worker)."""
    if ctx is not None and isinstance(ctx.context, Caller):
        token = ctx.context.api_token.get_secret_value()
        app_logger.warning("hook saw user digest %s token=%s", digest(ctx.context.user_id), token)


def _needs_approval(ctx: ToolContext, arguments: dict[str, object]) -> bool:
    """Calls of ``gated_whose`` wait for a person unless the caller's tenant is trusted."""
    return not (isinstance(ctx.context, Caller) and ctx.context.tenant == "trusted")


@app.tool(needs_approval=_needs_approval)
def gated_whose(ctx: ToolContext) -> dict[str, str]:
    """As ``whose``, behind an approval the caller's tenant decides."""
    return _seen(ctx)


def skill_whose(ctx: ToolContext) -> dict[str, str]:
    """A skill's tool: as ``whose``."""
    return _seen(ctx)


app.skill(Skill(name="ctxskill", system_prompt="A skill.", tools=[skill_whose]))

app.agent("ctx", tools=[whose, whose_slowly, leaky, gated_whose], hooks=Hooks(on_tool_result=_on_tool_result))
app.agent("ctx_helper", system_prompt="You help.", tools=[whose])
app.agent("ctx_lead", system_prompt="You lead.", tools=[whose], subagents=["ctx_helper"])
