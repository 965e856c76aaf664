"""The demo ``calculator`` tool: a small, safe arithmetic evaluator.

A hand-written tokenizer plus recursive-descent parser; nothing here calls
``eval``, ``compile`` or ``ast``.  Grammar (lowest to highest precedence)::

    expression := term (('+' | '-') term)*
    term       := unary (('*' | '/') unary)*
    unary      := ('+' | '-') unary | power
    power      := primary ('^' unary)?          # right-associative
    primary    := NUMBER | '(' expression ')'

so ``-2^2 == -4`` and ``2^3^2 == 2^9``, exactly as in Python's ``**``.
``**`` is accepted for ``^``, ``×`` for ``*``, ``÷`` for ``/`` and ``−``
(U+2212) for ``-``.

Every error is a :class:`CalculatorError` whose message ends with
``at position N`` (N is the 0-based character index into the expression);
the same index is available as ``error.position``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "CalculatorError",
    "MAX_EXPONENT",
    "MAX_EXPRESSION_CHARS",
    "MAX_NESTING",
    "MAX_RESULT_DIGITS",
    "evaluate",
]

Number = int | float

MAX_EXPRESSION_CHARS = 1_000
"""Longest accepted expression, in characters (not bytes)."""
MAX_NESTING = 100
"""Deepest accepted nesting of parentheses, prefix signs and powers."""
MAX_EXPONENT = 10_000
"""Largest accepted absolute value of an exponent."""
MAX_RESULT_DIGITS = 4_000
"""Largest (approximate) number of decimal digits of any integer result.

Kept below CPython's default int->str conversion limit (4,300 digits,
``sys.int_info.default_max_str_digits``) so every result can be printed."""
_MAX_RESULT_BITS = math.ceil(MAX_RESULT_DIGITS * math.log2(10))

_DIGITS = frozenset("0123456789")
# Operator spellings -> canonical operator.  Longest spellings first.
_OPERATOR_SPELLINGS = (
    ("**", "^"),
    ("+", "+"),
    ("-", "-"),
    ("\u2212", "-"),  # MINUS SIGN
    ("*", "*"),
    ("\u00d7", "*"),  # MULTIPLICATION SIGN
    ("/", "/"),
    ("\u00f7", "/"),  # DIVISION SIGN
    ("^", "^"),
)


class CalculatorError(ValueError):
    """An expression that cannot be evaluated; ``position`` is a 0-based char index."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} at position {position}")
        self.position = position


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "number", "op", "(", ")" or "end"
    text: str  # as written in the expression (for error messages)
    position: int
    value: Number | str | None = None  # the number, or the canonical operator


# --------------------------------------------------------------------- public


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression and return its value.

    Accepts integers and decimals (``42``, ``.5``, ``2.``, ``1e3``), the binary
    operators ``+ - * /`` and ``^`` (power; also ``**``), unary ``+``/``-``,
    parentheses and whitespace.

    The result is an ``int`` when every number is an integer literal and every
    division is exact (``17*23 -> 391``, ``6/3 -> 2``); otherwise a ``float``
    (``7/2 -> 3.5``, ``2^-1 -> 0.5``, ``1e3 -> 1000.0``).

    Limits: at most ``MAX_EXPRESSION_CHARS`` (1,000) characters, nesting of
    at most ``MAX_NESTING`` (100) levels, ``|exponent| <= MAX_EXPONENT``
    (10,000), integer results of at most about ``MAX_RESULT_DIGITS`` (4,000)
    decimal digits, finite real float results.  Oversized powers are refused
    before they are computed.

    Raises:
        CalculatorError: empty input, unknown character, malformed number,
            unbalanced parentheses, missing operand, trailing garbage,
            division by zero, a limit above exceeded, or a non-real result.
            The message names the 0-based character position.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"expression must be a string, not {type(expression).__name__}", 0)
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression too long: {len(expression)} characters (limit {MAX_EXPRESSION_CHARS})",
            MAX_EXPRESSION_CHARS,
        )
    tokens = list(_tokenize(expression))
    if tokens[0].kind == "end":
        raise CalculatorError("empty expression", 0)
    _check_parentheses(tokens)
    return _Parser(tokens).parse()


# ------------------------------------------------------------------ tokenizer


def _tokenize(text: str) -> Iterator[_Token]:
    """Yield the tokens of ``text``, ending with an ``end`` token."""
    i = 0
    while i < len(text):
        char = text[i]
        if char.isspace():
            i += 1
        elif char in _DIGITS or char == ".":
            token = _read_number(text, i)
            i += len(token.text)
            yield token
        elif char in "()":
            yield _Token(char, char, i)
            i += 1
        else:
            token = _read_operator(text, i)
            i += len(token.text)
            yield token
    yield _Token("end", "end of input", len(text))


def _read_operator(text: str, start: int) -> _Token:
    for spelling, operator in _OPERATOR_SPELLINGS:
        if text.startswith(spelling, start):
            return _Token("op", spelling, start, operator)
    raise CalculatorError(f"unknown character {text[start]!r}", start)


def _skip_digits(text: str, i: int) -> int:
    while i < len(text) and text[i] in _DIGITS:
        i += 1
    return i


def _read_number(text: str, start: int) -> _Token:
    """Read ``digits [. digits] [e [+-] digits]`` (one side of '.' may be empty)."""
    end = _skip_digits(text, start)
    is_float = False
    if end < len(text) and text[end] == ".":
        is_float = True
        end = _skip_digits(text, end + 1)
    literal = text[start:end]
    if literal == ".":
        raise CalculatorError("malformed number '.' (no digits)", start)
    if end < len(text) and text[end] in "eE":
        is_float = True
        end = _read_exponent_suffix(text, start, end)
        literal = text[start:end]
    if end < len(text) and text[end] == ".":
        raise CalculatorError(f"malformed number {text[start : end + 1]!r}", start)
    return _Token("number", literal, start, _number_value(literal, is_float, start))


def _read_exponent_suffix(text: str, start: int, e_index: int) -> int:
    i = e_index + 1
    if i < len(text) and text[i] in "+-":
        i += 1
    end = _skip_digits(text, i)
    if end == i:
        raise CalculatorError(f"malformed number {text[start:i]!r} (exponent has no digits)", start)
    return end


def _number_value(literal: str, is_float: bool, position: int) -> Number:
    if not is_float:
        return int(literal)
    value = float(literal)
    if not math.isfinite(value):
        raise CalculatorError(f"number {literal!r} is too large", position)
    return value


def _check_parentheses(tokens: list[_Token]) -> None:
    open_positions: list[int] = []
    for token in tokens:
        if token.kind == "(":
            open_positions.append(token.position)
        elif token.kind == ")":
            if not open_positions:
                raise CalculatorError("unbalanced parentheses: ')' has no matching '('", token.position)
            open_positions.pop()
    if open_positions:
        raise CalculatorError("unbalanced parentheses: '(' is never closed", open_positions[-1])


# --------------------------------------------------------------------- parser


class _Parser:
    """Recursive-descent parser that evaluates while it parses."""

    def __init__(self, tokens: list[_Token]) -> None:
        self._tokens = tokens
        self._index = 0
        self._depth = 0

    def parse(self) -> Number:
        try:
            value = self._expression()
        except RecursionError:  # backstop only: MAX_NESTING keeps the stack shallow
            raise CalculatorError("expression nested too deeply", self._peek().position) from None
        token = self._peek()
        if token.kind != "end":
            raise CalculatorError(
                f"unexpected {token.text!r} after a complete expression (missing operator?)",
                token.position,
            )
        return value

    # -- helpers

    def _peek(self) -> _Token:
        return self._tokens[self._index]

    def _take_operator(self, operators: str) -> _Token | None:
        token = self._peek()
        if token.kind == "op" and isinstance(token.value, str) and token.value in operators:
            self._index += 1
            return token
        return None

    @contextmanager
    def _nested(self, position: int) -> Iterator[None]:
        """Go one nesting level deeper, refusing absurd depths."""
        if self._depth >= MAX_NESTING:
            raise CalculatorError(
                f"expression nested too deeply (more than {MAX_NESTING} levels of parentheses, signs or powers)",
                position,
            )
        self._depth += 1
        yield
        self._depth -= 1

    # -- grammar rules (one method per rule of the module docstring)

    def _expression(self) -> Number:
        value = self._term()
        while (operator := self._take_operator("+-")) is not None:
            value = _apply(operator, value, self._term())
        return value

    def _term(self) -> Number:
        value = self._unary()
        while (operator := self._take_operator("*/")) is not None:
            value = _apply(operator, value, self._unary())
        return value

    def _unary(self) -> Number:
        sign = self._take_operator("+-")
        if sign is None:
            return self._power()
        with self._nested(sign.position):
            operand = self._unary()
        return -operand if sign.value == "-" else operand

    def _power(self) -> Number:
        base = self._primary()
        caret = self._take_operator("^")
        if caret is None:
            return base
        with self._nested(caret.position):
            exponent = self._unary()
        return _apply(caret, base, exponent)

    def _primary(self) -> Number:
        token = self._peek()
        if token.kind == "number":
            self._index += 1
            return token.value  # type: ignore[return-value]
        if token.kind == "(":
            self._index += 1
            with self._nested(token.position):
                value = self._expression()
            self._index += 1  # the ')': balance was checked before parsing
            return value
        where = "at end of input" if token.kind == "end" else f"before {token.text!r}"
        raise CalculatorError(f"missing operand {where}", token.position)


# ----------------------------------------------------------------- arithmetic


def _divide(left: Number, right: Number) -> Number:
    if isinstance(left, int) and isinstance(right, int):
        if right == 0:
            raise ZeroDivisionError
        quotient, remainder = divmod(left, right)
        if remainder == 0:
            return quotient
    return left / right


def _power(left: Number, right: Number) -> Number:
    if abs(right) > MAX_EXPONENT:
        raise _TooLarge(f"exponent {right!r} is too large (limit {MAX_EXPONENT})")
    if abs(left) > 1 and right > 0:
        digits = math.floor(right * math.log10(abs(left))) + 1
        if digits > MAX_RESULT_DIGITS:
            raise _TooLarge(f"result would have about {digits} digits (limit {MAX_RESULT_DIGITS})")
    return left**right


_OPERATIONS: dict[str, Callable[[Number, Number], Number]] = {
    "+": lambda left, right: left + right,
    "-": lambda left, right: left - right,
    "*": lambda left, right: left * right,
    "/": _divide,
    "^": _power,
}


class _TooLarge(Exception):
    """Internal: an operation was refused before computing it."""


def _apply(operator: _Token, left: Number, right: Number) -> Number:
    """Apply a binary operator, turning every arithmetic failure into an error."""
    try:
        result = _OPERATIONS[operator.value](left, right)  # type: ignore[index]
    except ZeroDivisionError:
        raise CalculatorError("division by zero", operator.position) from None
    except _TooLarge as refused:
        raise CalculatorError(str(refused), operator.position) from None
    except OverflowError:
        raise CalculatorError("result is too large", operator.position) from None
    return _checked(result, operator.position)


def _checked(result: object, position: int) -> Number:
    """Reject non-real, non-finite and oversized results."""
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number", position)
    if isinstance(result, float) and not math.isfinite(result):
        raise CalculatorError("result is not a finite number", position)
    if isinstance(result, int) and result.bit_length() > _MAX_RESULT_BITS:
        raise CalculatorError(
            f"result is too large (more than about {MAX_RESULT_DIGITS} digits)",
            position,
        )
    return result  # type: ignore[return-value]
