"""Which run a learner carries on (learner/releases.py `start_run`) and what `learner --fresh`
moves aside (learner/fresh.py), on hand-made checkpoint directories."""

import json

from learner.config import LearnerConfig
from learner.fresh import set_aside
from learner.releases import WriteAhead, start_run


def _config(checkpoint_dir, *, resume: bool = True) -> LearnerConfig:
    return LearnerConfig(
        model_path="m",
        train_data="t.jsonl",
        checkpoint={"dir": str(checkpoint_dir), "resume": resume},
    )


def _write_ahead(checkpoint_dir, **fields) -> None:
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    (checkpoint_dir / "dispatcher.json").write_text(json.dumps(fields))


def test_nothing_to_resume_starts_a_new_run_with_a_new_id_each_time(tmp_path):
    first = start_run(_config(tmp_path / "ckpt"), namespace="ns", checkpoint_cursor=None)
    second = start_run(_config(tmp_path / "ckpt"), namespace="ns", checkpoint_cursor=None)
    assert first.fresh and second.fresh
    assert first.run_id.startswith("ns-") and second.run_id.startswith("ns-")
    assert first.run_id != second.run_id
    assert first.write_ahead is None


def test_a_run_lost_before_its_first_checkpoint_carries_on_from_its_write_ahead(tmp_path):
    _write_ahead(tmp_path, run_id="ns-lost", num_released=6)
    start = start_run(_config(tmp_path), namespace="ns", checkpoint_cursor=None)
    assert (start.run_id, start.fresh) == ("ns-lost", False)
    assert start.write_ahead == WriteAhead("ns-lost", 6)


def test_a_checkpoint_names_the_run_and_keeps_its_own_write_ahead(tmp_path):
    _write_ahead(tmp_path, run_id="ns-a", num_released=10)
    start = start_run(_config(tmp_path), namespace="ns", checkpoint_cursor={"run_id": "ns-a"})
    assert (start.run_id, start.fresh, start.write_ahead) == ("ns-a", False, WriteAhead("ns-a", 10))


def test_a_write_ahead_of_another_run_is_ignored(tmp_path):
    _write_ahead(tmp_path, run_id="ns-b", num_released=10)
    start = start_run(_config(tmp_path), namespace="ns", checkpoint_cursor={"run_id": "ns-a"})
    assert (start.run_id, start.write_ahead) == ("ns-a", None)


def test_checkpoints_and_write_aheads_from_before_run_ids_carry_on_the_namespace_ids(tmp_path):
    _write_ahead(tmp_path, num_released=4)  # its tasks were `<namespace>-<i>`
    from_write_ahead = start_run(_config(tmp_path), namespace="ns", checkpoint_cursor=None)
    assert (from_write_ahead.run_id, from_write_ahead.write_ahead) == ("ns", WriteAhead("ns", 4))
    from_checkpoint = start_run(_config(tmp_path), namespace="ns", checkpoint_cursor={})
    assert from_checkpoint.run_id == "ns"


def test_resume_off_ignores_the_write_ahead(tmp_path):
    _write_ahead(tmp_path, run_id="ns-lost", num_released=6)
    start = start_run(_config(tmp_path, resume=False), namespace="ns", checkpoint_cursor=None)
    assert start.fresh and start.run_id != "ns-lost" and start.write_ahead is None


def test_fresh_moves_an_earlier_runs_checkpoints_aside_and_leaves_an_empty_dir_alone(tmp_path):
    root = tmp_path / "checkpoints"
    assert set_aside(root) is None  # nothing there
    root.mkdir()
    assert set_aside(root) is None and root.is_dir()  # empty: nothing to move
    (root / "step_00000002").mkdir()
    (root / "dispatcher.json").write_text("{}")
    moved = set_aside(root)
    assert moved is not None and moved.name.startswith("checkpoints.earlier-")
    assert not root.exists()
    assert sorted(p.name for p in moved.iterdir()) == ["dispatcher.json", "step_00000002"]
    root.mkdir()
    (root / "dispatcher.json").write_text("{}")
    again = set_aside(root)  # the same second: a name of its own
    assert again is not None and again != moved and moved.is_dir()
