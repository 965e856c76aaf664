"""The LLM client: chat-completions requests, SSE streaming, retries (seed §8, §9, §6.3)."""

from typing import TYPE_CHECKING

from smith_worker.lazy import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time each loads its module on first use
    from smith_worker.llm.client import (
        LlmClient as LlmClient,
        OnEvent as OnEvent,
        events_for_response as events_for_response,
        parse_completion as parse_completion,
        parse_retry_after as parse_retry_after,
    )
    from smith_worker.llm.sse import (
        SseEvent as SseEvent,
        SseParser as SseParser,
    )
    from smith_worker.llm.stream import (
        ChatStreamAssembler as ChatStreamAssembler,
        ChatStreamDecoder as ChatStreamDecoder,
    )
    from smith_worker.llm.types import (
        LlmClientConfig as LlmClientConfig,
        LlmRequest as LlmRequest,
        LlmResponse as LlmResponse,
        SamplingParams as SamplingParams,
        StreamEvent as StreamEvent,
        StreamFinished as StreamFinished,
        StreamTokenDelta as StreamTokenDelta,
        StreamToolCallCompleted as StreamToolCallCompleted,
        StreamToolCallStarted as StreamToolCallStarted,
        ToolChoice as ToolChoice,
        ToolSchema as ToolSchema,
    )

_EXPORTS = {
    "ChatStreamAssembler": "stream",
    "ChatStreamDecoder": "stream",
    "LlmClient": "client",
    "LlmClientConfig": "types",
    "LlmRequest": "types",
    "LlmResponse": "types",
    "OnEvent": "client",
    "SamplingParams": "types",
    "SseEvent": "sse",
    "SseParser": "sse",
    "StreamEvent": "types",
    "StreamFinished": "types",
    "StreamTokenDelta": "types",
    "StreamToolCallCompleted": "types",
    "StreamToolCallStarted": "types",
    "ToolChoice": "types",
    "ToolSchema": "types",
    "events_for_response": "client",
    "parse_completion": "client",
    "parse_retry_after": "client",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
