"""Guard the public surface: the wire types' fields (names, types, defaults) are a contract
between processes that may run different versions, and the flags of `learner prepare` one
with users' scripts. Changing them must be a visible, deliberate edit of this file, not an
accident."""

import argparse

import msgspec

from broker.wire import EpisodeCheckpoint, PolicyVersion, PromptTask, Trajectory


def _fields(struct: type[msgspec.Struct]) -> list[tuple[str, str]]:
    info = msgspec.inspect.type_info(struct)
    return [(f.name, type(f.type).__name__) for f in info.fields]


def test_prompt_task_fields():
    assert _fields(PromptTask) == [
        ("task_id", "StrType"),
        ("step", "IntType"),
        ("min_version", "IntType"),
        ("max_staleness", "IntType"),  # the bound its group is trained by (-1: not said)
        ("group_size", "IntType"),
        ("env_class", "StrType"),
        ("data_source", "StrType"),
        ("prompt", "ListType"),
        ("reward_spec", "DictType"),
        ("extra_info", "DictType"),
        ("is_eval", "BoolType"),
    ]


def test_trajectory_fields():
    assert _fields(Trajectory) == [
        ("trajectory_id", "StrType"),
        ("group_id", "StrType"),
        ("group_size", "IntType"),
        ("sample_index", "IntType"),
        ("step", "IntType"),
        ("max_staleness", "IntType"),
        ("env_class", "StrType"),
        ("data_source", "StrType"),
        ("actor_id", "StrType"),
        ("is_eval", "BoolType"),
        ("prompt_len", "IntType"),
        ("token_ids", "BytesType"),
        ("logprobs", "BytesType"),
        ("loss_mask", "BytesType"),
        ("versions", "BytesType"),
        ("reward", "FloatType"),
        ("stop_reason", "StrType"),
        ("num_turns", "IntType"),
        ("num_tool_calls", "IntType"),
        ("env_metrics", "DictType"),
        ("timing", "DictType"),
        ("resumed_turns", "IntType"),  # taken over from an episode checkpoint
        ("resumed_tokens", "IntType"),
        ("segment_starts", "ListType"),  # an agent episode's further conversations
    ]


def test_episode_checkpoint_fields():
    assert _fields(EpisodeCheckpoint) == [
        ("task_id", "StrType"),
        ("sample_index", "IntType"),
        ("stored", "BoolType"),
        ("actor_id", "StrType"),
        ("num_turns", "IntType"),
        ("prompt_len", "IntType"),
        ("token_ids", "BytesType"),
        ("logprobs", "BytesType"),
        ("loss_mask", "BytesType"),
        ("versions", "BytesType"),
        ("reward", "FloatType"),
        ("actions", "ListType"),
        ("observations", "ListType"),
        ("env_metrics", "DictType"),
        ("turn_finish_reasons", "ListType"),
        ("num_env_retries", "IntType"),
        ("timing", "DictType"),
        ("recorded_at", "FloatType"),
    ]


def test_policy_version_fields():
    assert _fields(PolicyVersion) == [
        ("version", "IntType"),
        ("published_at", "FloatType"),
        ("snapshot_path", "StrType"),
        ("snapshot_version", "IntType"),
        ("broadcast_addr", "StrType"),
        ("lineage", "StrType"),  # actors learn that a resumed learner rolled back
        ("deltas_path", "StrType"),  # weights/formats/delta_log.py, for store-only actors
    ]


def test_learner_prepare_flags():
    from learner.prepare import add_prepare_arguments

    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    flags = sorted(o for action in parser._actions for o in action.option_strings)
    assert flags == [
        "--column", "--env-class", "--env-field", "--eval-fraction", "--format", "--from",
        "--held-out", "--help", "--min-eval-per-env", "--output-dir", "--seed", "--size",
        "--split", "--system", "--task-config", "-h",
    ]  # fmt: skip
