"""A turn's structured output on the client side (docs/architecture.md, Structured output).

An agent declared with ``output_type`` ends its turns with an answer validated on the worker: the final
message's ``content`` is the output as JSON text, and ``turn.completed`` carries it as ``output``.
``send(..., output_type=MyModel)`` returns an :class:`OutputMessage` whose ``output`` is that JSON parsed
into ``MyModel`` (:func:`with_output`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from smith_client.errors import InvalidRequestError, OutputValidationError
from smith_client.messages import AssistantMessage
from smith_client.validation import shown

#: The caller's output model.
M = TypeVar("M", bound=BaseModel)


class OutputMessage(AssistantMessage, Generic[M]):
    """A final :class:`AssistantMessage` with its structured ``output`` parsed into the caller's model ``M``
    (``content`` is the same output as JSON text)."""

    output: M


def validation_errors(exc: ValidationError) -> list[str]:
    """pydantic's errors as ``"<path>: <message>"`` lines (``<root>`` for the value itself)."""
    return [f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors()]


def check_output_type(output_type: Any) -> None:
    """Raise :class:`InvalidRequestError` (``field="output_type"``) unless ``output_type`` is None or a pydantic
    model class: checked before the turn is sent, so a bad one loses no answer."""
    if output_type is None or (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
        return
    raise InvalidRequestError(
        f"output_type must be a pydantic model class, got {shown(output_type)}", field="output_type"
    )


def with_output(message: AssistantMessage, output_type: type[M]) -> OutputMessage[M]:
    """``message`` (a turn's final answer) with its ``content`` parsed into ``output_type`` (a pydantic model).

    Raises :class:`OutputValidationError` (``retries`` 0) when the content does not validate: the agent has
    no ``output_type``, or one that differs from the caller's.
    """
    try:
        output = output_type.model_validate_json(message.content)
    except ValidationError as exc:
        raise OutputValidationError(
            f"the turn's answer does not validate as {output_type.__name__}: {exc.error_count()} error(s)",
            errors=validation_errors(exc),
        ) from exc
    return OutputMessage[output_type](**dict(message), output=output)  # type: ignore[valid-type]


__all__ = ["M", "OutputMessage", "check_output_type", "validation_errors", "with_output"]
