"""common/environ.py: variables set for a block, and restored after it."""

import os

from common.environ import environ_set


def test_variables_are_set_for_the_block_and_restored_after_it(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OMP_PLACES", raising=False)
    with environ_set({"OMP_NUM_THREADS": "1", "OMP_PLACES": "{0}"}):
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["OMP_PLACES"] == "{0}"
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OMP_PLACES" not in os.environ
    with environ_set(None):
        assert os.environ["OMP_NUM_THREADS"] == "7"
