"""Tests for the demo calculator tool (smith_worker.demo.calculator)."""

from __future__ import annotations

import inspect
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smith_worker.demo import calculator
from smith_worker.demo.calculator import (
    MAX_EXPRESSION_CHARS,
    MAX_NESTING,
    CalculatorError,
    evaluate,
)

# ------------------------------------------------------------------ happy paths


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("17*23", 391),
        ("6/3", 2),
        ("-6/3", -2),
        ("7/-7", -1),
        ("1+2*3", 7),
        ("(1+2)*3", 9),
        ("10-4-3", 3),  # left-associative
        ("64/4/2", 8),  # left-associative
        ("2^10", 1024),
        ("2**10", 1024),
        ("2^3^2", 512),  # right-associative: 2^(3^2)
        ("(2^3)^2", 64),
        ("-2^2", -4),  # power binds tighter than a unary minus on its left
        ("(-2)^2", 4),
        ("2^-2^2", 2**-(2**2)),
        ("--3", 3),
        ("+-+3", -3),
        ("5--3", 8),
        ("2*-3", -6),
        ("-(-(4))", 4),
        ("  1 +\t2 \n", 3),
        ("0", 0),
        ("007", 7),
        ("6\u00f74\u00d72", 3.0),  # ÷ and ×
        ("\u22123", -3),  # U+2212 MINUS SIGN
        ("2^0", 1),
        ("0^0", 1),
        ("1^10000", 1),
        ("(-1)^10000", 1),
    ],
)
def test_evaluates(expression: str, expected: int | float) -> None:
    result = evaluate(expression)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("7/2", 3.5),
        ("1/3", 1 / 3),
        ("2^-1", 0.5),
        (".5", 0.5),
        ("2.", 2.0),
        ("2.5*2", 5.0),
        ("1e3", 1000.0),
        ("1E3", 1000.0),
        ("12e+2", 1200.0),
        ("2.5e-1", 0.25),
        (".5e1", 5.0),
        ("1e-400", 0.0),  # underflow to zero is fine
        ("0.1+0.2", 0.1 + 0.2),
        ("4^0.5", 2.0),
        ("0.5^10000", 0.5**10000),
        ("1.5+10^300", 1.5 + 10**300),
    ],
)
def test_float_results(expression: str, expected: float) -> None:
    result = evaluate(expression)
    assert isinstance(result, float)
    assert result == expected


def test_large_but_allowed_integer_results_are_exact() -> None:
    assert evaluate("2^10000") == 2**10000  # 3,011 digits
    assert evaluate("9^4000") == 9**4000  # 3,817 digits
    assert evaluate("10^3999") == 10**3999  # 4,000 digits
    str(evaluate("9^4000"))  # printable under CPython's 4,300-digit limit
    assert evaluate("123456789123456789*987654321987654321") == (
        123456789123456789 * 987654321987654321
    )


def test_nesting_up_to_the_limit_is_accepted() -> None:
    depth = MAX_NESTING
    assert evaluate("(" * depth + "1" + ")" * depth) == 1
    assert evaluate("-" * depth + "1") == (-1) ** depth


def test_expression_of_exactly_max_length_is_accepted() -> None:
    expression = "1+" * ((MAX_EXPRESSION_CHARS - 1) // 2) + "1"
    expression = expression.rjust(MAX_EXPRESSION_CHARS)
    assert len(expression) == MAX_EXPRESSION_CHARS
    assert evaluate(expression) == (MAX_EXPRESSION_CHARS - 1) // 2 + 1


def test_source_uses_no_python_evaluation() -> None:
    source = inspect.getsource(calculator)
    assert not re.search(r"\b(eval|exec|compile|literal_eval)\s*\(", source)
    assert not re.search(r"^\s*(import|from)\s+ast\b", source, re.MULTILINE)


# ----------------------------------------------------------------------- errors


def assert_error(expression: object, message: str, position: int) -> None:
    """``evaluate`` fails with ``message`` (a substring) at ``position``."""
    with pytest.raises(CalculatorError) as caught:
        evaluate(expression)  # type: ignore[arg-type]
    error = caught.value
    assert message in str(error)
    assert error.position == position
    assert str(error).endswith(f"at position {position}")


def test_calculator_error_is_a_value_error() -> None:
    assert issubclass(CalculatorError, ValueError)


@pytest.mark.parametrize("expression", ["", " ", "\t\n  "])
def test_empty_input(expression: str) -> None:
    assert_error(expression, "empty expression", 0)


def test_non_string_input() -> None:
    assert_error(42, "expression must be a string, not int", 0)


@pytest.mark.parametrize(
    ("expression", "character", "position"),
    [("1 $ 2", "$", 2), ("abc", "a", 0), ("2x", "x", 1), ("1,5", ",", 1), ("1 % 2", "%", 2)],
)
def test_unknown_character(expression: str, character: str, position: int) -> None:
    assert_error(expression, f"unknown character {character!r}", position)


@pytest.mark.parametrize(
    ("expression", "message", "position"),
    [
        (".", "malformed number '.' (no digits)", 0),
        ("1+.", "malformed number '.' (no digits)", 2),
        ("1.2.3", "malformed number '1.2.'", 0),
        ("1e", "malformed number '1e' (exponent has no digits)", 0),
        ("2*1e+", "malformed number '1e+' (exponent has no digits)", 2),
        ("1e999", "number '1e999' is too large", 0),
    ],
)
def test_malformed_numbers(expression: str, message: str, position: int) -> None:
    assert_error(expression, message, position)


@pytest.mark.parametrize(
    ("expression", "message", "position"),
    [
        ("(1+2", "'(' is never closed", 0),
        ("((1+2)", "'(' is never closed", 0),
        ("(1+(2", "'(' is never closed", 3),
        ("1+2)", "')' has no matching '('", 3),
        (")(", "')' has no matching '('", 0),
        ("(1))+(2", "')' has no matching '('", 3),
    ],
)
def test_unbalanced_parentheses(expression: str, message: str, position: int) -> None:
    assert_error(expression, f"unbalanced parentheses: {message}", position)


@pytest.mark.parametrize(
    ("expression", "token", "position"),
    [("2 3", "3", 2), ("2(3)", "(", 1), ("(1)(2)", "(", 3), ("1+2 .5", ".5", 4)],
)
def test_trailing_garbage(expression: str, token: str, position: int) -> None:
    assert_error(
        expression,
        f"unexpected {token!r} after a complete expression (missing operator?)",
        position,
    )


@pytest.mark.parametrize(
    ("expression", "where", "position"),
    [
        ("1+", "at end of input", 2),
        ("-", "at end of input", 1),
        ("2^", "at end of input", 2),
        ("*2", "before '*'", 0),
        ("1+*2", "before '*'", 2),
        ("2***3", "before '*'", 3),
        ("2^^3", "before '^'", 2),
        ("()", "before ')'", 1),
        ("(1+)", "before ')'", 3),
        ("4/ /2", "before '/'", 3),
    ],
)
def test_missing_operand(expression: str, where: str, position: int) -> None:
    assert_error(expression, f"missing operand {where}", position)


@pytest.mark.parametrize(
    ("expression", "position"),
    [("1/0", 1), ("1.0/0", 3), ("1/0.0", 1), ("5/(3-3)", 1), ("0^-1", 1), ("0.0^-1", 3)],
)
def test_division_by_zero(expression: str, position: int) -> None:
    assert_error(expression, "division by zero", position)


def test_expression_too_long() -> None:
    assert_error(
        "1" * (MAX_EXPRESSION_CHARS + 1),
        f"expression too long: {MAX_EXPRESSION_CHARS + 1} characters (limit 1000)",
        MAX_EXPRESSION_CHARS,
    )


def test_length_limit_counts_characters_not_bytes() -> None:
    expression = "1\u00d7" * 499 + "1"  # 999 characters, 1,497 UTF-8 bytes
    assert evaluate(expression) == 1


@pytest.mark.parametrize(
    ("expression", "position"),
    [
        ("(" * (MAX_NESTING + 1) + "1" + ")" * (MAX_NESTING + 1), MAX_NESTING),
        ("-" * (MAX_NESTING + 1) + "1", MAX_NESTING),
        ("-(" * 60 + "1" + ")" * 60, MAX_NESTING),
        ("1^" * (MAX_NESTING + 1) + "1", 2 * MAX_NESTING + 1),
    ],
)
def test_nesting_too_deep(expression: str, position: int) -> None:
    assert_error(expression, "expression nested too deeply (more than 100 levels", position)


@pytest.mark.parametrize(
    ("expression", "message", "position"),
    [
        ("2^10001", "exponent 10001 is too large (limit 10000)", 1),
        ("2^-10001", "exponent -10001 is too large (limit 10000)", 1),
        ("1^100000", "exponent 100000 is too large (limit 10000)", 1),
        ("2^2^2^2^2", "exponent 65536 is too large (limit 10000)", 1),
        ("1.5^20000.5", "exponent 20000.5 is too large (limit 10000)", 3),
        ("99^9999", "result would have about 19955 digits (limit 4000)", 2),
        ("10^4000", "result would have about 4001 digits (limit 4000)", 2),
        ("(9^4000)*(9^4000)", "result is too large (more than about 4000 digits)", 8),
        ("1.5^5000", "result is too large", 3),
    ],
)
def test_refuses_astronomical_results(expression: str, message: str, position: int) -> None:
    assert_error(expression, message, position)


@pytest.mark.parametrize(
    ("expression", "message", "position"),
    [
        ("1e308*10", "result is not a finite number", 5),
        ("1e308+1e308", "result is not a finite number", 5),
        ("10^400/3", "result is too large", 6),
        ("10^400*1.5", "result is too large", 6),
        ("(-8)^(1/3)", "result is not a real number", 4),
        ("(-1)^0.5", "result is not a real number", 4),
    ],
)
def test_refuses_non_finite_and_non_real_results(
    expression: str, message: str, position: int
) -> None:
    assert_error(expression, message, position)


# ------------------------------------------------------------- property tests


def _integer_expressions(operators: str) -> st.SearchStrategy[str]:
    """Random well-formed integer expressions (Python syntax == calculator syntax)."""
    leaves = st.integers(min_value=0, max_value=1_000).map(str)

    def extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        binary = st.tuples(children, st.sampled_from(operators), children).map(
            lambda parts: " ".join(parts)
        )
        return st.one_of(
            binary,
            children.map(lambda child: f"({child})"),
            children.map(lambda child: f"-{child}"),
        )

    return st.recursive(leaves, extend, max_leaves=25)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_integer_expressions("+-*"))
def test_matches_python_on_integer_expressions(expression: str) -> None:
    expected = eval(expression, {"__builtins__": {}})  # reference, test-only
    result = evaluate(expression)
    assert result == expected
    assert type(result) is int


@settings(max_examples=200)
@given(
    st.recursive(
        st.integers(min_value=0, max_value=9).map(str),
        lambda children: st.one_of(
            st.tuples(children, st.sampled_from(["+", "-", "*"]), children).map(" ".join),
            st.tuples(children, st.integers(min_value=0, max_value=3)).map(
                lambda parts: f"({parts[0]})^{parts[1]}"
            ),
            children.map(lambda child: f"-{child}"),
        ),
        max_leaves=8,
    )
)
def test_power_matches_python(expression: str) -> None:
    expected = eval(expression.replace("^", "**"), {"__builtins__": {}})  # test-only
    assert evaluate(expression) == expected


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.integers(min_value=-(10**6), max_value=10**6).filter(bool),
)
def test_integer_division_is_exact_or_true_division(dividend: int, divisor: int) -> None:
    result = evaluate(f"{dividend}/({divisor})")
    if dividend % divisor == 0:
        assert result == dividend // divisor
        assert type(result) is int
    else:
        assert result == dividend / divisor
        assert type(result) is float


@settings(max_examples=500)
@given(st.text(alphabet="0123456789.eE+-*/^() \u00d7\u00f7x", max_size=40))
def test_arbitrary_input_only_ever_raises_calculator_error(expression: str) -> None:
    try:
        result = evaluate(expression)
    except CalculatorError as error:
        assert 0 <= error.position <= len(expression)
    else:
        assert isinstance(result, (int, float))
        assert not isinstance(result, bool)
        assert not isinstance(result, float) or math.isfinite(result)
