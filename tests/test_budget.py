"""Tests for ``ctxrt.Budget``'s validation (P2; issue 14 item 6).

Determinism: pure construction, no store, no clock.
"""

import re

import pytest

from ctxrt import Budget


def test_a_budget_no_larger_than_the_default_reserve_is_refused_saying_it_leaves_no_room():
    """Budget(max_tokens=3000) keeps the 4,000-token default reserve: refused, naming both fields."""
    with pytest.raises(ValueError, match=r"leaves no room") as caught:
        Budget(max_tokens=3000)
    assert "max_tokens" in str(caught.value) and "reserve_for_response" in str(caught.value)
    assert "3,000" in str(caught.value) and "4,000" in str(caught.value)


@pytest.mark.parametrize(("max_tokens", "reserve"), [(4_000, 4_000), (0, 0), (1_000, 2_000)])
def test_a_budget_whose_reserve_takes_everything_is_refused(max_tokens, reserve):
    """max_tokens must exceed reserve_for_response, else a compile could hold nothing."""
    with pytest.raises(ValueError, match="leaves no room"):
        Budget(max_tokens=max_tokens, reserve_for_response=reserve)


def test_a_budget_with_one_token_of_room_is_accepted():
    """The smallest budget that leaves room is one token more than the reserve."""
    assert Budget(max_tokens=4_001).usable == 1
    assert Budget(max_tokens=1, reserve_for_response=0).usable == 1


@pytest.mark.parametrize("field", ["max_tokens", "reserve_for_response"])
@pytest.mark.parametrize("value", [1.5, "5000", None, True, False])
def test_a_budget_refuses_values_that_are_not_ints_naming_the_field(field, value):
    """Floats, strings, None and bools (an int subclass) are refused, and the message names the field."""
    with pytest.raises(ValueError, match=rf"^Budget {field} must be an int \(a number of tokens\), "
                                         rf"not {type(value).__name__} {re.escape(repr(value))}$"):
        Budget(**{field: value})


@pytest.mark.parametrize("field", ["max_tokens", "reserve_for_response"])
def test_a_budget_refuses_a_negative_value_naming_the_field(field):
    """A negative token count is refused before the room check, naming the field and the value."""
    with pytest.raises(ValueError, match=rf"^Budget {field} must not be negative, got -5$"):
        Budget(**{field: -5})
