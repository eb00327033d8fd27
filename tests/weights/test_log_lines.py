"""What the weight path logs on an actor (once little signal in much noise).

- A learner's weight store that keeps going away: one warning line at once, then at most
  one per 30 s with a count, no traceback; an INFO line each time the store is back; a
  store found gone is not asked again on leaving. Real stores in processes of their own
  (sender_process.py), killed with SIGKILL and started again on the same port, as the
  launcher restarts a learner.
- vLLM's `RotaryEmbedding: Failed to load weights` at every reload: real vLLM reload code
  on a real rotary layer shows that the cache comes back unchanged (benign), and that the
  worker's filter drops that message and no other.
"""

from __future__ import annotations

import logging

import pytest
import torch

from tests.log_capture import Said
from tests.weights.dying_learner import kill, start_sender
from weights.actor_side.subscription import WeightSubscription
from weights.engine_side.vocab_in_place import ReloadNotices

NUM_LOSSES = 3


def test_a_store_lost_again_and_again_within_the_window_is_one_warning(caplog):
    proc, port = start_sender(0, "idle")
    subscription = WeightSubscription("127.0.0.1", port)
    store_ids = [subscription.store_id]
    try:
        with caplog.at_level(logging.INFO, logger="weights.actor_side.subscription"):
            for _ in range(NUM_LOSSES):
                kill(proc)
                assert subscription.wait_round(-1, 0.5) is None  # finds the store gone
                proc, _ = start_sender(port, "idle")  # a restarted learner
                while subscription.store_id == store_ids[-1]:
                    assert subscription.wait_round(-1, 0.5) is None  # reconnects, nothing new
                store_ids.append(subscription.store_id)
    finally:
        kill(proc)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].getMessage().startswith(f"weight store at 127.0.0.1:{port} unreachable (")
    assert "reconnecting" in warnings[0].getMessage()
    back = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert back == [
        f"weight store at 127.0.0.1:{port} is back (store {store_id}): registered as member 1"
        for store_id in store_ids[1:]
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert "Traceback" not in caplog.text


def test_leaving_a_store_found_gone_asks_it_nothing(capfd):
    # It did: at every actor shutdown after its learner had gone, a `set` on the dead
    # connection, and torch's C++ backtrace for it on stderr.
    proc, port = start_sender(0, "idle")
    subscription = WeightSubscription("127.0.0.1", port)
    kill(proc)
    assert subscription.wait_round(-1, 0.3) is None  # finds the store gone
    capfd.readouterr()
    subscription.leave()
    assert subscription.left
    assert capfd.readouterr().err == ""


def _reload_loading_nothing(model: torch.nn.Module) -> None:
    """vLLM's layerwise reload (what `reload_weights` does around the loads) with nothing
    loaded: what a rotary layer goes through at every update."""
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_processing,
        initialize_layerwise_reload,
        record_metadata_for_reloading,
    )

    record_metadata_for_reloading(model)
    initialize_layerwise_reload(model)
    finalize_layerwise_processing(model, None)


@pytest.mark.vllm
def test_a_rotary_layer_reloads_its_own_cache_and_its_warning_is_filtered():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    vllm_logger, said = logging.getLogger(ReloadNotices.LOGGERS[0]), Said()
    vllm_logger.addHandler(said)
    try:
        with set_current_vllm_config(VllmConfig()):
            rope = get_rope(head_size=16, max_position=64, is_neox_style=True, dtype=torch.float32)
            model = torch.nn.Sequential(rope)
            cache = rope.cos_sin_cache.clone()
            _reload_loading_nothing(model)
            assert said.messages == ["RotaryEmbedding: Failed to load weights"]
            assert torch.equal(rope.cos_sin_cache, cache)  # the same cache, put back

            said.messages.clear()
            vllm_logger.addFilter(ReloadNotices())
            _reload_loading_nothing(model)
            vllm_logger.warning("%s: Failed to load weights", "QKVParallelLinear")
            assert said.messages == ["QKVParallelLinear: Failed to load weights"]  # still said
    finally:
        vllm_logger.removeHandler(said)
        vllm_logger.filters.clear()
