"""The LLM client: chat-completions requests, SSE streaming, retries (seed §8, §9, §6.3)."""

from smith_worker.llm.client import LlmClient, OnEvent, events_for_response, parse_completion, parse_retry_after
from smith_worker.llm.sse import SseEvent, SseParser
from smith_worker.llm.stream import ChatStreamAssembler, ChatStreamDecoder
from smith_worker.llm.types import (
    LlmClientConfig,
    LlmRequest,
    LlmResponse,
    SamplingParams,
    StreamEvent,
    StreamFinished,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolChoice,
    ToolSchema,
)

__all__ = [
    "ChatStreamAssembler",
    "ChatStreamDecoder",
    "LlmClient",
    "LlmClientConfig",
    "LlmRequest",
    "LlmResponse",
    "OnEvent",
    "SamplingParams",
    "SseEvent",
    "SseParser",
    "StreamEvent",
    "StreamFinished",
    "StreamTokenDelta",
    "StreamToolCallCompleted",
    "StreamToolCallStarted",
    "ToolChoice",
    "ToolSchema",
    "events_for_response",
    "parse_completion",
    "parse_retry_after",
]
