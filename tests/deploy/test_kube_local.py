"""The pure parts of the manifest smoke run (kube_local.py), on hand-written objects."""

from __future__ import annotations

import itertools

import pytest

from tests.deploy.kube_local import (
    LoopbackPlan,
    cluster_hostnames,
    container_env,
    expand_refs,
    loopback_plan,
    rewrite,
)

NS = {"namespace": "tether"}


def _service(name, ports, **spec):
    return {"kind": "Service", "metadata": {"name": name, **NS}, "spec": {"ports": ports, **spec}}


def _workload(kind, name, containers, **spec):
    template = {"spec": {"containers": containers, **spec.pop("pod", {})}}
    return {"kind": kind, "metadata": {"name": name, **NS}, "spec": {"template": template, **spec}}


OBJECTS = [
    _service("tether-nats", [{"name": "client", "port": 4222, "targetPort": "client"}]),
    _service("tether-learner", [{"port": 29400}], clusterIP="None"),
    _workload(
        "StatefulSet",
        "tether-nats",
        [{"name": "nats", "ports": [{"name": "client", "containerPort": 4222}]}],
        replicas=2,
        serviceName="tether-nats-headless",
    ),
    _workload(
        "Job",
        "tether-learner",
        [{"name": "learner", "ports": [{"name": "rdzv", "containerPort": 29400}]}],
        completionMode="Indexed",
        completions=2,
        pod={"subdomain": "tether-learner"},
    ),
]


def test_cluster_hostnames_cover_services_and_indexed_pods():
    names = cluster_hostnames(OBJECTS)
    for name in [
        "tether-nats",
        "tether-nats.tether",
        "tether-nats.tether.svc.cluster.local",
        "tether-learner-1.tether-learner",
        "tether-learner-0.tether-learner.tether.svc",
        "tether-nats-1.tether-nats-headless",
    ]:
        assert name in names
    assert "tether-learner-2.tether-learner" not in names  # completions = 2


def test_loopback_plan_gives_each_port_one_free_port_shared_with_its_service():
    free = itertools.count(50000)
    plan = loopback_plan(OBJECTS, lambda: next(free))
    assert plan.ports == {4222: 50000, 29400: 50001}
    assert plan.hosts["tether-nats"] == plan.hosts["0.0.0.0"] == "127.0.0.1"


def test_a_service_port_follows_its_target():
    objects = [
        _service("web", [{"port": 80, "targetPort": "http"}]),
        _workload(
            "Deployment", "web", [{"name": "w", "ports": [{"name": "http", "containerPort": 8080}]}]
        ),
    ]
    plan = loopback_plan(objects, lambda: 41000)
    assert plan.ports == {8080: 41000, 80: 41000}
    with pytest.raises(ValueError, match="no container port"):
        loopback_plan([_service("x", [{"port": 1, "targetPort": 2}])], lambda: 3)


PLAN = LoopbackPlan(
    hosts={
        "tether-learner": "127.0.0.1",
        "tether-learner-0.tether-learner": "127.0.0.1",
        "tether-envserver": "127.0.0.1",
        "0.0.0.0": "127.0.0.1",
    },
    ports={29400: 40001, 50051: 40002, 9300: 40003},
)


@pytest.mark.parametrize(
    "before, after",
    [
        (
            "--rdzv-endpoint=tether-learner-0.tether-learner:29400",
            "--rdzv-endpoint=127.0.0.1:40001",
        ),
        ('addresses = ["tether-envserver:50051"]', 'addresses = ["127.0.0.1:40002"]'),
        ('host = "0.0.0.0"\nport = 50051', 'host = "127.0.0.1"\nport = 40002'),
        ("metrics_port = 9300", "metrics_port = 40003"),
        ("--port=50051", "--port=40002"),
        ("listen: 0.0.0.0:29400", "listen: 127.0.0.1:40001"),
        # Left alone: longer names, unknown ports, numbers that are not ports.
        ("tether-learner-headless:29400", "tether-learner-headless:29400"),
        ("tether-envserver.example.com:50051", "tether-envserver.example.com:50051"),
        ("127.0.0.1:1234", "127.0.0.1:1234"),
        ("max_model_len = 50051", "max_model_len = 50051"),
    ],
)
def test_rewrite_hosts_and_ports(before, after):
    assert rewrite(before, PLAN) == after


def test_rewrite_mount_paths_as_whole_components():
    mounts = {"/inputs": "/tmp/x/inputs", "/data": "/tmp/x/nats-data"}
    text = 'model = "/inputs/models/tiny"\nstore_dir: /data\ntrain = "/inputs/data/train.jsonl"'
    assert rewrite(text, PLAN, mounts) == (
        'model = "/tmp/x/inputs/models/tiny"\nstore_dir: /tmp/x/nats-data\n'
        'train = "/tmp/x/inputs/data/train.jsonl"'
    )
    assert (
        rewrite("--config=/inputs2/x /other/inputs", PLAN, mounts)
        == "--config=/inputs2/x /other/inputs"
    )


def test_expand_refs_like_the_kubelet():
    env = {"POD_IP": "10.0.0.7", "N": "2"}
    assert expand_refs("store_host=$(POD_IP)", env) == "store_host=10.0.0.7"
    assert expand_refs("--nnodes=$(N) $(MISSING) $$(N)", env) == "--nnodes=2 $(MISSING) $(N)"


def test_container_env_resolves_every_source():
    container = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(C)"},  # C is defined below: kept as written
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "c"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "pw"}}},
            {
                "name": "KEY",
                "valueFrom": {"secretKeyRef": {"name": "w", "key": "k", "optional": True}},
            },
        ]
    }
    env = container_env(
        container,
        configmaps={"cm": {"c": "see"}},
        secrets={"s": {"pw": "hunter2"}},
        fields={"status.podIP": "127.0.0.1"},
    )
    assert env == {"A": "1", "B": "1-$(C)", "C": "see", "IP": "127.0.0.1", "PW": "hunter2"}
    with pytest.raises(KeyError, match="secretKeyRef s/pw"):
        container_env(
            container, configmaps={"cm": {"c": ""}}, secrets={}, fields={"status.podIP": ""}
        )


def test_rewrite_never_rewrites_what_it_wrote():
    mounts = {"/tmp": "/tmp/smoke/pod/tmp", "/runs": "/tmp/smoke/pvc/runs"}
    assert rewrite("/tmp/a /runs/b", PLAN, mounts) == "/tmp/smoke/pod/tmp/a /tmp/smoke/pvc/runs/b"
    plan = LoopbackPlan(hosts={}, ports={4222: 9300, 9300: 40000})
    assert (
        rewrite("127.0.0.1:4222 metrics_port = 9300", plan) == "127.0.0.1:9300 metrics_port = 40000"
    )
