"""Session fixtures for the tiny model: the tokenizer as the builder trains it, and the
random-weight model (a cached build under `$TETHER_CACHE/tinymodel` or
`<repo>/.cache/tinymodel`, seconds on a miss). The warm-started model is shipped in the
repository (`demo.tinymodel.shipped_model_dir()`)."""

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
