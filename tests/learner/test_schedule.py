import pytest

from learner.trainer.optimizer import lr_multiplier


def test_warmup_then_constant():
    got = [
        lr_multiplier(k, warmup_steps=4, schedule="constant", total_steps=None) for k in range(6)
    ]
    assert got == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_by_hand():
    """Warmup 2, total 12: decay over 10 steps; halfway (step 7) is 0.5, the end is the floor."""
    f = lambda k, floor=0.0: lr_multiplier(  # noqa: E731
        k, warmup_steps=2, schedule="cosine", total_steps=12, min_lr_ratio=floor
    )
    assert f(2) == pytest.approx(1.0)
    assert f(7) == pytest.approx(0.5)
    assert f(12) == pytest.approx(0.0, abs=1e-12)
    assert f(7, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert f(100, 0.1) == pytest.approx(0.1)


def test_linear_by_hand():
    f = lambda k: lr_multiplier(k, warmup_steps=0, schedule="linear", total_steps=4)  # noqa: E731
    assert [f(k) for k in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_decay_needs_total_steps():
    with pytest.raises(ValueError, match="total_steps"):
        lr_multiplier(0, warmup_steps=0, schedule="cosine", total_steps=None)
