"""The LLM client: chat-completions requests, SSE streaming, retries.

See docs/architecture.md, Model requests and HTTP retry policy.
"""

from typing import TYPE_CHECKING

from smith_worker.lazy import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time each loads its module on first use
    from smith_worker.llm.client import (
        EncodedRequest as EncodedRequest,
    )
    from smith_worker.llm.client import (
        LlmClient as LlmClient,
    )
    from smith_worker.llm.client import (
        OnEvent as OnEvent,
    )
    from smith_worker.llm.client import (
        events_for_response as events_for_response,
    )
    from smith_worker.llm.client import (
        parse_completion as parse_completion,
    )
    from smith_worker.llm.client import (
        parse_retry_after as parse_retry_after,
    )
    from smith_worker.llm.sse import (
        SseEvent as SseEvent,
    )
    from smith_worker.llm.sse import (
        SseParser as SseParser,
    )
    from smith_worker.llm.stream import (
        ChatStreamAssembler as ChatStreamAssembler,
    )
    from smith_worker.llm.stream import (
        ChatStreamDecoder as ChatStreamDecoder,
    )
    from smith_worker.llm.types import (
        LlmClientConfig as LlmClientConfig,
    )
    from smith_worker.llm.types import (
        LlmRequest as LlmRequest,
    )
    from smith_worker.llm.types import (
        LlmResponse as LlmResponse,
    )
    from smith_worker.llm.types import (
        SamplingParams as SamplingParams,
    )
    from smith_worker.llm.types import (
        StreamEvent as StreamEvent,
    )
    from smith_worker.llm.types import (
        StreamFinished as StreamFinished,
    )
    from smith_worker.llm.types import (
        StreamTokenDelta as StreamTokenDelta,
    )
    from smith_worker.llm.types import (
        StreamToolCallCompleted as StreamToolCallCompleted,
    )
    from smith_worker.llm.types import (
        StreamToolCallStarted as StreamToolCallStarted,
    )
    from smith_worker.llm.types import (
        ToolChoice as ToolChoice,
    )
    from smith_worker.llm.types import (
        ToolSchema as ToolSchema,
    )

_EXPORTS = {
    "ChatStreamAssembler": "stream",
    "ChatStreamDecoder": "stream",
    "EncodedRequest": "client",
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
