"""Agent Smith client contract: messages, events, errors, job payloads and the thin client.

A web app installs only this package (it depends on redis, arq, pydantic and
orjson) and uses ``SmithClient`` (asyncio) or ``SyncSmithClient`` (blocking,
for WSGI). See docs/architecture.md, Process roles.
"""

from smith_client.approvals import Decision
from smith_client.client import SmithClient, TurnHandle
from smith_client.errors import (
    ConfigurationError,
    ConflictError,
    ContextOverflowError,
    ContextValidationError,
    ConversationBusyError,
    EventsTrimmedError,
    InternalError,
    InvalidRequestError,
    LlmApiError,
    McpError,
    McpProtocolError,
    NoPendingCallError,
    OutputValidationError,
    ParseError,
    QuotaExceededError,
    SkillError,
    SmithError,
    SmithTimeoutError,
    ToolError,
    TransportError,
    TurnCancelledError,
    TurnNotFoundError,
    TurnPausedError,
    UnknownAgentError,
    UnknownSkillError,
)
from smith_client.events import Event, PendingItem
from smith_client.inputs import InputResponse
from smith_client.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TokenUsage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from smith_client.output import OutputMessage
from smith_client.sharding import ShardedSmithClient, SyncShardedSmithClient
from smith_client.sync_client import SyncSmithClient, SyncTurnHandle
from smith_client.tenants import TenantLimits
from smith_client.usage import AgentUsage

__all__ = [
    "AgentUsage",
    "AssistantMessage",
    "ConfigurationError",
    "ConflictError",
    "ContextOverflowError",
    "ContextValidationError",
    "ConversationBusyError",
    "Decision",
    "Event",
    "EventsTrimmedError",
    "InputResponse",
    "InternalError",
    "InvalidRequestError",
    "LlmApiError",
    "McpError",
    "McpProtocolError",
    "Message",
    "NoPendingCallError",
    "OutputMessage",
    "OutputValidationError",
    "ParseError",
    "PendingItem",
    "QuotaExceededError",
    "ShardedSmithClient",
    "SkillError",
    "SmithClient",
    "SmithError",
    "SmithTimeoutError",
    "SyncShardedSmithClient",
    "SyncSmithClient",
    "SyncTurnHandle",
    "TenantLimits",
    "SystemMessage",
    "TokenUsage",
    "ToolCall",
    "ToolError",
    "ToolMessage",
    "TransportError",
    "TurnHandle",
    "TurnCancelledError",
    "TurnNotFoundError",
    "TurnPausedError",
    "UnknownAgentError",
    "UnknownSkillError",
    "UserMessage",
]
