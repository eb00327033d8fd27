"""Session fixtures for the tiny model: the tokenizer as the builder trains it (the random-
weight model is tests/conftest.py's `tiny_model_dir`; the warm-started model is shipped in
the repository, `demo.tinymodel.shipped_model_dir()`)."""

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny tokenizer as the builder trains it (about a second)."""
    from demo.tokenizer import build_tokenizer

    return build_tokenizer()
