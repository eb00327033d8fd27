"""Trajectories for the metrics tests, built from the few numbers each test cares about."""

from __future__ import annotations

from broker.codec import pack_tokens
from broker.wire import Trajectory


def trajectory(
    *,
    reward: float,
    stop_reason: str = "stop",
    group_id: str = "g",
    sample_index: int = 0,
    group_size: int = 4,
    env_class: str = "calculator",
    num_turns: int = 1,
    num_tool_calls: int = 0,
    prompt_ids: tuple[int, ...] = (10, 11),
    response_ids: tuple[int, ...] = (20, 21),
    observation_positions: tuple[int, ...] = (),
    versions: tuple[int, int] = (0, 0),
    env_metrics: dict[str, float] | None = None,
    data_source: str = "",
    timing: dict[str, float] | None = None,
) -> Trajectory:
    """Prompt then response tokens. Response tokens get loss mask 1 and policy versions
    rising from `versions[0]` to `versions[1]`, except at `observation_positions` (indices
    into the response: templated observation tokens, mask 0, version -1). An `error:*`
    episode gets an all-zero loss mask, as the actor sends it."""
    is_error = stop_reason.startswith("error")
    mask, token_versions = [0] * len(prompt_ids), [-1] * len(prompt_ids)
    policy_positions = [i for i in range(len(response_ids)) if i not in observation_positions]
    low, high = versions
    for i in range(len(response_ids)):
        if i in observation_positions:
            mask.append(0)
            token_versions.append(-1)
        else:
            rank = policy_positions.index(i)
            mask.append(0 if is_error else 1)
            token_versions.append(low if rank < len(policy_positions) - 1 else high)
    token_ids = list(prompt_ids) + list(response_ids)
    return Trajectory(
        trajectory_id=f"{group_id}/{sample_index}",
        group_id=group_id,
        group_size=group_size,
        sample_index=sample_index,
        step=0,
        env_class=env_class,
        data_source=data_source,
        prompt_len=len(prompt_ids),
        reward=reward,
        stop_reason=stop_reason,
        num_turns=num_turns,
        num_tool_calls=num_tool_calls,
        env_metrics=env_metrics or {},
        timing=timing or {},
        **pack_tokens(
            token_ids=token_ids,
            logprobs=[-0.5 if m else 0.0 for m in mask],
            loss_mask=mask,
            versions=token_versions,
        ),
    )


def group(group_id: str, *specs: dict) -> list[Trajectory]:
    """One group: each spec is the keyword arguments of one `trajectory` (sample i)."""
    return [
        trajectory(group_id=group_id, sample_index=i, group_size=len(specs), **spec)
        for i, spec in enumerate(specs)
    ]
