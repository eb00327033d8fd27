"""One config system: every config file we ship validates as a whole (`RunConfig`), every
role refuses a section it does not know, every field of every section is documented, and
the config modules import no runtime module (a bad config answers in well under a second)."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pydantic
import pytest

from actors.config import VllmEngineConfig
from common.config import SECTIONS, load_section
from deploy.config import RunConfig, load_run_config
from learner.config import LearnerConfig

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "configs").glob("*.toml")) + sorted(
    (REPO / "deploy" / "k8s").glob("*/tether.toml")
)
# What the launchers wire in on the command line (paths and addresses of a run).
WIRED = [
    "learner.model_path=/m",
    "learner.train_data=/d/train.jsonl",
    "learner.eval_data=/d/eval.jsonl",
    "actor.engine.model=/m",
]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_shipped_config_files_validate_as_a_whole(path):
    run = load_run_config(path, WIRED)
    assert run.broker.namespace


def test_run_config_has_a_field_per_known_section():
    assert tuple(RunConfig.model_fields) == SECTIONS


def test_a_misspelt_section_is_refused_by_every_role(tmp_path):
    from actors.config import ActorConfig
    from envservers.config import EnvServerConfig
    from learner.config import LearnerConfig

    path = tmp_path / "c.toml"
    path.write_text('[brokr]\nurl = "nats://x:4222"\n[learner]\nmodel_path = "m"\n')
    for model, section in ((LearnerConfig, "learner"), (ActorConfig, "actor")):
        with pytest.raises(ValueError, match="unknown section.*brokr"):
            load_section(model, path, section)
    with pytest.raises(ValueError, match="unknown section.*brokr"):
        load_section(EnvServerConfig, path, "envserver")
    with pytest.raises(ValueError, match="unknown section.*brokr"):
        load_run_config(path)


def test_errors_name_every_bad_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[learner]\nmodel_path = "m"\n[learner.optim]\nlrr = 1\n')
    with pytest.raises(ValueError) as error:
        load_run_config(path, ["actor.rollout.max_turns=0", "actor.engine.model=m"])
    assert "learner.optim.lrr: Extra inputs are not permitted" in str(error.value)
    assert "actor.rollout.max_turns: Input should be greater than or equal to 1" in str(error.value)


BASE = ["learner.model_path=m", "actor.engine.model=m", 'envserver.envs=["calculator"]']


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # wrong types
        (['learner.group_size="eight"'], "learner.group_size: Input should be a valid integer"),
        (['actor.rollout.overlong_filtering="sometimes"'], "actor.rollout.overlong_filtering"),
        (['envserver.envs="calculator"'], "envserver.envs: Input should be a valid list"),
        (["broker.namespace=[1]"], "broker.namespace: Input should be a valid string"),
        (["actor.env=5"], "actor.env: Input should be a valid dictionary"),
        # out of range
        (["broker.stream_replicas=9"], "broker.stream_replicas: Input should be less than"),
        (["envserver.port=70000"], "envserver.port: Input should be less than or equal"),
        (["envserver.max_observation_chars=10"], "envserver.max_observation_chars"),
        # impossible within a section
        (["broker.url=nats://alice:pw@host:4222"], "broker.url: .*credentials do not belong"),
        (["broker.url=http://host:4222"], "broker.url: .*expected a nats:// or tls:// URL"),
        (["broker.tls.cert_file=c.pem", "broker.tls.key_file=k.pem"], "broker.tls: .*ca_file"),
        (["envserver.tls.key_file=k.pem"], "envserver.tls: .*cert_file and key_file"),
        (["actor.env.tls.cert_file=c.pem"], "actor.env.tls: .*key_file"),
        (["actor.rollout.max_sequence_length=4096"], "actor: .*exceeds engine.max_model_len"),
        # impossible across sections: both keys named
        (
            ["actor.heartbeat_s=40", "broker.prompt_ack_wait_s=60"],
            "actor.heartbeat_s \\(40.0\\) must be at most half of broker.prompt_ack_wait_s",
        ),
        (
            ["envserver.max_message_bytes=16777216"],
            "actor.env.max_message_bytes \\(8388608\\) must equal envserver.max_message_bytes",
        ),
        (
            ["envserver.tls.cert_file=c.pem", "envserver.tls.key_file=k.pem"],
            "actor.env.tls.ca_file is empty but envserver.tls.cert_file is set",
        ),
        (
            [
                "envserver.tls.cert_file=c.pem",
                "envserver.tls.key_file=k.pem",
                "envserver.tls.client_ca_file=ca.pem",
                "actor.env.tls.ca_file=ca.pem",
            ],
            "actor.env.tls.cert_file is empty but envserver.tls.client_ca_file is set",
        ),
    ],
)
def test_wrong_typed_and_impossible_configs_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_run_config(None, BASE + overrides)


def test_the_wired_base_config_itself_is_valid():
    run = load_run_config(None, BASE)
    assert run.actor.env.max_message_bytes == run.envserver.max_message_bytes


def test_a_bad_config_is_an_exit_code_and_a_message_naming_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[envserver]\nport = "fifty"\n'
        '[learner]\nmodel_path = "m"\ngroup_size = "eight"\n'
        '[actor]\nheartbeat_s = "often"\n[actor.engine]\nmodel = "m"\n'
    )
    for command, key in (
        (["envservers.cli"], "envserver.port: Input should be a valid integer"),
        (["learner.cli"], "learner.group_size: Input should be a valid integer"),
        (["actors.cli", "--replicas", "1"], "actor.heartbeat_s: Input should be a valid number"),
    ):
        out = subprocess.run(
            [sys.executable, "-m", *command, "--config", str(path)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        assert out.returncode == 2, (command, out.stderr[-2000:])
        assert key in out.stderr and "Traceback" not in out.stderr


def _models(model: type[pydantic.BaseModel], seen: set) -> list[type[pydantic.BaseModel]]:
    """`model` and every config model nested in its fields."""
    if model in seen:
        return []
    seen.add(model)
    found = [model]
    for field in model.model_fields.values():
        for arg in [field.annotation, *getattr(field.annotation, "__args__", ())]:
            if isinstance(arg, type) and issubclass(arg, pydantic.BaseModel):
                found += _models(arg, seen)
    return found


def test_every_field_of_every_section_has_a_docstring():
    for model in _models(RunConfig, set()):
        documented = set()
        for cls in model.__mro__:  # a field may be declared (and documented) in a base
            if not (issubclass(cls, pydantic.BaseModel) and cls.__module__ != "pydantic.main"):
                continue
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
            documented |= {
                node.target.id
                for node, after in zip(body, body[1:], strict=False)
                if isinstance(node, ast.AnnAssign)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
            }
        assert documented == set(model.model_fields), model.__name__


def test_config_modules_import_no_runtime_module():
    modules = [
        "deploy.config",
        "actors.config",
        "learner.config",
        "envservers.config",
        "broker.config",
        "weights.config",
    ]
    heavy = ("torch", "vllm", "transformers", "grpc", "nats", "numpy")
    code = (
        f"import sys; import {', '.join(modules)}; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"


def test_a_lora_run_whose_engines_cannot_take_the_adapter_is_refused(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[learner]\nmodel_path = "m"\n[actor.engine]\nmodel = "m"\n')
    lora = ["learner.finetune.mode=lora", "learner.finetune.rank=32"]
    with pytest.raises(ValueError, match="raise actor.engine.max_lora_rank"):
        load_run_config(path, [*lora, "actor.engine.enable_lora=true"])
    load_run_config(path, [*lora, "actor.engine.enable_lora=true", "actor.engine.max_lora_rank=32"])
    assert load_run_config(path, lora).learner.finetune.rank == 32  # merging engines: any rank


def test_both_sections_speak_torchs_dtype_names():
    """One vocabulary: the short names are read as torch's, on both sides."""
    learner = LearnerConfig(model_path="m", dtype="bf16")
    engine = VllmEngineConfig(model="m", dtype="bf16")
    assert learner.dtype == engine.dtype == "bfloat16"
    with pytest.raises(pydantic.ValidationError):
        LearnerConfig(model_path="m", dtype="float16")  # the learner computes in fp32/bf16
