"""Session fixtures for the tiny model (move `tiny_model_dir` / `warm_tiny_model_dir` to
tests/conftest.py to share them). Both live in the persistent build cache
(`$TETHER_CACHE/tinymodel` or `<repo>/.cache/tinymodel`): rebuilt only when the recipe or
the builder's source changes."""

import pytest


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tiny tokenizer as the builder trains it (about a second)."""
    from demo.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir():
    """Directory of the tiny Qwen2 with random weights (seconds to build)."""
    from demo.tinymodel import build_random_tiny_model

    return build_random_tiny_model()


@pytest.fixture(scope="session")
def warm_tiny_model_dir():
    """Directory of the warm-started tiny Qwen2 of DEFAULT_RECIPE (minutes on a cache miss)."""
    from demo.tinymodel import build_tiny_model

    return build_tiny_model()
