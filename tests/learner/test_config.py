import subprocess
import sys
import textwrap

import pytest

from common.config import load_section
from learner.config import LearnerConfig


def _config(**fields):
    return LearnerConfig.model_validate({"model_path": "m", **fields})


def test_defaults_are_valid():
    config = _config()
    assert config.algorithm.policy_loss == "ppo" and config.max_staleness == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"algorithm": {"policy_loss": "gspo"}}, "seq_mean_token_mean"),
        ({"algorithm": {"policy_loss": "gspo", "importance_weight": "tis"}}, "gspo's ratio"),
        ({"algorithm": {"behaviour_weight_cap": 2.0}}, "behaviour_weight_cap applies"),
        (
            {
                "algorithm": {
                    "advantage_estimator": "dr_grpo",
                    "loss_reduction": "seq_mean_token_mean",
                }
            },
            "dr_grpo drops",
        ),
        ({"algorithm": {"clip_ratio_c": 1.0}}, "greater than 1"),
        ({"optim": {"warmup_steps": 10}, "total_steps": 5}, "exceeds total_steps"),
        ({"optim": {"betas": [0.9, 1.0]}}, "betas"),
        ({"eval_interval": 5}, "eval_data"),
        ({"group_size": 1}, "greater than or equal to 2"),
        ({"lr": 1e-5}, "Extra inputs"),
    ],
)
def test_bad_configs_say_what_is_wrong(fields, message):
    with pytest.raises(ValueError, match=message):
        _config(**fields)


def test_load_section_from_toml_with_overrides(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        textwrap.dedent(
            """
            [learner]
            model_path = "runs/sft"
            max_staleness = 0
            [learner.algorithm]
            ratio_anchor = "proximal"
            importance_weight = "decoupled"
            behaviour_weight_cap = 5.0
            [actor]
            replicas = 2
            """
        )
    )
    config = load_section(LearnerConfig, path, "learner", ["learner.optim.lr=3e-6"])
    assert config.max_staleness == 0 and config.optim.lr == 3e-6
    assert config.algorithm.behaviour_weight_cap == 5.0
    with pytest.raises(ValueError, match="learner.algorithm.tis_cap"):
        load_section(LearnerConfig, path, "learner", ["learner.algorithm.tis_cap=-1"])


def test_importing_the_config_does_not_import_torch():
    code = "import sys, learner.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
