"""`verifiers:MODULE` as a user meets it before any episode: `learner prepare --from` turning
the environment's dataset into rows, and an env server refusing at start-up, in one line,
what it cannot run (real verifiers 0.1.3; the environment modules are written here)."""

from __future__ import annotations

import argparse
import textwrap

import pytest

from common import verifiers_envs
from common.plugins import PluginError
from envservers.registry import build_providers
from learner.data import load_dataset
from learner.prepare import add_prepare_arguments, run_prepare
from tests.envservers.conftest import server_config

MODULES = {
    "vf_few_shot": """
        import verifiers as vf
        from datasets import Dataset

        def load_environment(num_examples=6):
            rows = [{"question": f"{n} + 1?", "answer": str(n + 1), "info": '{"n": %d}' % n}
                    for n in range(num_examples)]
            few_shot = [{"role": "user", "content": "1 + 1?"},
                        {"role": "assistant", "content": "2"}]
            return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Add.",
                                    few_shot=few_shot)
    """,
    "vf_completion": """
        import verifiers as vf
        from datasets import Dataset

        def load_environment():
            rows = [{"prompt": "1 + 1 =", "answer": "2"}]
            return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), message_type="completion")
    """,
    "vf_not_an_env": "def load_environment():\n    return {'env': 'no'}\n",
    "vf_no_loader": "X = 1\n",
}


@pytest.fixture
def modules(tmp_path, monkeypatch):
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))


def _prepare(out, *argv: str) -> list[dict]:
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    assert run_prepare(parser.parse_args([*argv, "--output-dir", str(out)])) == 0
    return load_dataset(out / "train.jsonl") + load_dataset(out / "eval.jsonl")


def test_prepare_writes_the_environments_dataset_as_rows(tmp_path):
    rows = _prepare(tmp_path, "--from", "verifiers:tests.agents.vf_calculator", "--size", "40",
                    "--task-config", "kind=tool", "--eval-fraction", "0.25")  # fmt: skip
    assert len(rows) == 40
    for row in rows:
        assert row["env_class"] == row["data_source"] == "verifiers:tests.agents.vf_calculator"
        system, user = row["prompt"]
        a, b = (int(x) for x in user["content"].removeprefix("What is ").rstrip("?").split(" + "))
        assert row["reward_spec"]["ground_truth"] == str(a + b) and system["role"] == "system"
        assert row["extra_info"]["verifiers"] == {"task": "default", "info": {}}


def test_a_few_shot_prompt_travels_whole_and_info_text_becomes_an_object(modules):
    rows = verifiers_envs.make_rows("vf-few-shot", size=3, seed=1, settings={}, env_class="fs")
    for row in rows:
        assert row["env_class"] == "fs" and [m["role"] for m in row["prompt"]] == ["system", "user"]
        whole = row["extra_info"]["verifiers"]["prompt"]
        assert [m["role"] for m in whole] == ["system", "user", "assistant", "user"]
        assert whole[-1] == row["prompt"][-1]
        n = row["extra_info"]["verifiers"]["info"]["n"]
        assert row["reward_spec"]["ground_truth"] == str(n + 1)
        prompt, answer, task, info = verifiers_envs.rollout_inputs(row)
        assert (prompt, answer, task, info) == (whole, str(n + 1), "default", {"n": n})


@pytest.mark.parametrize(
    ("entry", "settings", "says"),
    [
        ("verifiers:vf_missing", {}, "importing vf_missing failed: ModuleNotFoundError"),
        ("verifiers:vf_no_loader", {}, "module vf_no_loader has no attribute 'load_environment'"),
        ("verifiers:vf_not_an_env", {}, "load_environment returned a dict, not a verifiers.Env"),
        ("verifiers:vf_completion", {}, "a 'completion'-format environment; Tether trains chat"),
        ("verifiers:vf_few_shot", {"shots": 2}, "unexpected keyword argument 'shots'"),
        ("verifiers:tests.agents.vf_calculator", {"kind": "odd"}, "kind must be single, multi"),
        ("verifiers:vf_few_shot", {"time_limit_s": -1}, "time_limit_s must be a number"),
    ],
)
def test_what_the_server_cannot_run_stops_it_in_one_line(modules, entry, settings, says):
    config = server_config(envs=[f"v={entry}"], plugins={"v": settings} if settings else {})
    with pytest.raises(PluginError) as caught:
        build_providers(config)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_verifiers_release_with_another_rollout_api_is_refused(modules, monkeypatch):
    import verifiers

    async def rollout(self, input, client, model, sampling_args=None): ...

    monkeypatch.setattr(verifiers.Environment, "rollout", rollout)
    with pytest.raises(PluginError, match=r"pip install verifiers==0\.1\.3") as caught:
        verifiers_envs.load("vf_few_shot", {})
    assert "takes (input, client, model, sampling_args)" in str(caught.value)


def test_prepare_refuses_more_rows_than_the_dataset_has(tmp_path, modules, capsys):
    from learner.prepare import prepare_main

    argv = ["--from", "verifiers:vf_few_shot", "--size", "9", "--output-dir", str(tmp_path)]
    assert prepare_main(argv) == 2
    assert "its dataset has 6 rows, fewer than --size 9" in capsys.readouterr().err
