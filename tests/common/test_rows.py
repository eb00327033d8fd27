"""common/rows.py: the one row validator. What JSON cannot carry is named by its path."""

import datetime
import decimal

import pytest

from common.rows import json_problem, row_problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, "x", None, True, {"b": []}]}, None),
        ({"a": [1, (2, 3)]}, "f.a[1]: expected JSON data (string, number, bool, null, list"),
        ({"a": b"raw"}, "f.a: expected JSON data"),
        ({"when": datetime.date(2026, 1, 1)}, "f.when: expected JSON data"),
        ({"price": decimal.Decimal("1.5")}, "f.price: expected JSON data"),
        ({1: "int key"}, "f: key 1 is not a string"),
        ({"big": -(2**63)}, None),
        ({"big": 2**64}, "f.big: integer 18446744073709551616 does not fit in 64 bits"),
        ({"x": float("-inf")}, "f.x: -inf is not a finite number"),
    ],
)
def test_json_problem_names_the_path(value, problem):
    found = json_problem(value, field="f")
    assert found == problem if problem is None else found.startswith(problem)


def test_a_row_good_enough_for_every_role():
    row = {
        "data_source": "calc",
        "env_class": "calculator",
        "prompt": [{"role": "user", "content": "1+1?", "name": "alice"}],
        "reward_spec": {"ground_truth": "2", "must_call_tool": True},
    }
    assert row_problem(row) is None
    assert row_problem({**row, "extra_info": None}) is None
    assert row_problem({**row, "extra_info": {"t": {1, 2}}}).startswith("extra_info.t: expected")
