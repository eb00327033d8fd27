"""deploy/cluster.py (`make cluster-up` / `make cluster-down`): which target, and which
rendered objects are applied or deleted; deploy/prepare.py's symlink and dataset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.cluster import choose_target, select
from deploy.prepare import PrepareConfig, point_symlink, prepare_data

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "explicit, kube, ray, expected",
    [
        ("local", True, "ray://head:10001", "local"),  # an explicit target wins
        ("ray", True, None, "ray"),
        (None, True, "ray://head:10001", "k8s"),  # a kube context before RAY_ADDRESS
        (None, False, "ray://head:10001", "ray"),
        (None, True, None, "k8s"),
    ],
)
def test_choose_target(explicit, kube, ray, expected):
    assert choose_target(explicit, kube_context=kube, ray_address=ray) == expected


def test_no_target_names_the_three():
    with pytest.raises(ValueError) as e:
        choose_target(None, kube_context=False, ray_address="")
    assert all(f"TARGET={t}" in str(e.value) for t in ("k8s", "ray", "local"))
    with pytest.raises(ValueError, match="one of k8s, ray, local"):
        choose_target("slurm", kube_context=True, ray_address=None)


def test_make_cluster_up_without_a_cluster_says_what_to_do(tmp_path):
    # No kubectl context (an empty kubeconfig) and no RAY_ADDRESS.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(KUBECONFIG=str(tmp_path / "none"), PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-m", "deploy.cluster", "up"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "TARGET=k8s" in result.stderr and "TARGET=ray" in result.stderr
    assert "TARGET=local" in result.stderr


def _obj(kind: str, api: str = "v1") -> dict:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": kind.lower()}}


def test_select_keeps_volumes_and_skips_absent_crds():
    objects = [
        _obj("Service"),
        _obj("PersistentVolumeClaim"),
        _obj("PodMonitor", "monitoring.coreos.com/v1"),
        _obj("Job", "batch/v1"),
    ]
    kinds = lambda chosen: [o["kind"] for o in chosen]  # noqa: E731
    assert kinds(select(objects, monitoring=True, volumes=True)) == [
        "Service",
        "PersistentVolumeClaim",
        "PodMonitor",
        "Job",
    ]
    # Down keeps the volumes (checkpoints); a cluster without the operator has no PodMonitor.
    assert kinds(select(objects, monitoring=False, volumes=False)) == ["Service", "Job"]


def test_prepare_points_a_relative_symlink_and_writes_the_dataset(tmp_path):
    first, second = tmp_path / "cache" / "a", tmp_path / "cache" / "b"
    first.mkdir(parents=True)
    second.mkdir()
    link = tmp_path / "models" / "tiny"
    point_symlink(link, first)
    assert link.resolve() == first and not os.path.isabs(os.readlink(link))
    point_symlink(link, second)  # a newer build replaces it
    assert link.resolve() == second
    config = PrepareConfig(data_dir=str(tmp_path / "data"), num_train_rows=5, num_eval_rows=3)
    train, evals = prepare_data(config)
    assert len(train.read_text().splitlines()) == 5 and len(evals.read_text().splitlines()) == 3


def test_args_after_the_double_dash_reach_the_target_as_they_are(monkeypatch):
    """`make cluster-up ARGS="--detach ray.actor_replicas=4"` runs
    `deploy.cluster up --target=ray -- --detach ray.actor_replicas=4`."""
    from deploy import cluster

    seen = {}
    monkeypatch.setattr(
        cluster, "run", lambda action, target, overlay, *, purge, extra: seen.update(extra=extra)
    )
    argv = ["up", "--target=ray", "--", "--detach", "--config", "c.toml", "ray.actor_replicas=4"]
    assert cluster.main(argv) is None
    assert seen["extra"] == ["--detach", "--config", "c.toml", "ray.actor_replicas=4"]
    cluster.main(["down", "--target=ray", "--"])
    assert seen["extra"] == []


def test_ray_cluster_without_ray_installed_or_with_a_bad_override_answers_at_once():
    result = subprocess.run(
        [sys.executable, "-m", "deploy.ray_cluster", "up", "--detach", "ray.actor_replicas=0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": "127.0.0.1:1"},
        timeout=60,
    )
    assert result.returncode == 2
    assert "ray.actor_replicas" in result.stderr or "Ray is not installed" in result.stderr
