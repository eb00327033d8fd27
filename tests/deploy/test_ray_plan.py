"""The Ray driver's placement plan (deploy/ray_plan.py), pure: nodes with resources in, an
assignment out; ports per host; each process's command line and the learner ranks'
torch.distributed environment; the prepared run's records (deploy/ray_records.py). No Ray
needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.config import RayRunConfig, load_run_config
from deploy.ray_commands import (
    base_wiring,
    commands,
    fixed_ports,
    learner_env,
    metrics_targets,
    port_bases,
    port_needs,
    ports_from_pools,
    ports_per_host,
)
from deploy.ray_plan import HEAD_RESOURCE, Node, PlanError, gpus_per_actor, make_plan, plan_run
from deploy.ray_records import Prepared, launch_spec, metrics_ports, pg_names, run_state

REPO = Path(__file__).resolve().parents[2]


def head(cpus=16, **extra) -> Node:
    resources = {"CPU": cpus, HEAD_RESOURCE: 1.0, **extra}
    return Node("head0000aaaa", "10.0.0.1", resources, is_head=True)


def gpu_node(i: int, gpus=8, cpus=96) -> Node:
    return Node(f"gpu{i:04d}bbbb", f"10.0.1.{i}", {"CPU": cpus, "GPU": gpus})


def cpu_node(i: int, cpus=32) -> Node:
    return Node(f"cpu{i:04d}cccc", f"10.0.2.{i}", {"CPU": cpus})


def _plan(nodes, *, learner_ranks=1, actor_gpus=1.0, **ray):
    """make_plan with a `[ray]` section of these settings."""
    return make_plan(nodes, RayRunConfig(**ray), learner_ranks=learner_ranks, actor_gpus=actor_gpus)


DEMAND = dict(
    learner_ranks=8,
    learner_nodes=1,
    actor_replicas=12,
    envservers=2,
    gpus_per_learner_rank=1,
    cpus_per_learner_rank=4,
    cpus_per_actor=4,
    cpus_per_envserver=2,
    cpus_nats=1,
)
ONE_CPU_EACH = dict(cpus_per_learner_rank=1, cpus_per_actor=1, cpus_per_envserver=1)
"""A learner rank, an actor and an env server take one CPU each: clusters of a few CPUs."""


def test_nats_on_the_head_learner_packed_on_one_gpu_node_actors_on_gpus_envservers_on_cpus():
    nodes = [head(), gpu_node(1), gpu_node(2), gpu_node(3), cpu_node(1), cpu_node(2)]
    plan = _plan(nodes, **DEMAND)
    assert plan.nats.node_id == "head0000aaaa"
    learner_nodes = {s.node_id for s in plan.learner}
    assert len(learner_nodes) == 1  # STRICT_PACK: every rank on one node
    assert [s.index for s in plan.learner] == list(range(8))
    assert [s.local_rank for s in plan.learner] == list(range(8))
    (learner_node,) = learner_nodes
    gpu_ids = {n.node_id for n in nodes if "GPU" in n.resources}
    assert {s.node_id for s in plan.actors} <= gpu_ids
    # 12 actors on the 16 GPUs the learner left, spread over the two other nodes
    assert learner_node not in {s.node_id for s in plan.actors}
    per_node = [sum(s.node_id == n for s in plan.actors) for n in sorted(gpu_ids - {learner_node})]
    assert per_node == [6, 6]
    # env servers on CPU nodes, one each (most free CPU first)
    assert sorted(s.node_id for s in plan.envservers) == ["cpu0001cccc", "cpu0002cccc"]
    assert plan.learner[0].bundle == {"CPU": 4, "GPU": 1}
    assert plan.envservers[0].bundle == {"CPU": 2}
    assert plan.notes == ()
    assert "learner-0" in plan.describe(nodes) and "head" in plan.describe(nodes)


def test_too_few_gpus_is_a_clear_error():
    with pytest.raises(PlanError) as error:
        _plan([head(), gpu_node(1, gpus=8)], **DEMAND)
    message = str(error.value)
    assert "too few GPUs" in message
    assert "needs 20 GPU" in message and "has 8" in message
    assert "learner 8 ranks x 1" in message and "actors 12 replicas x 1" in message


def test_no_gpu_node_at_all_is_a_clear_error():
    with pytest.raises(PlanError, match="too few GPUs.*has 0.*GPU nodes: none"):
        _plan([head(), cpu_node(1)], **DEMAND)


def test_learner_ranks_must_fit_one_node_even_when_the_total_is_enough():
    # 16 GPUs in all, but no node holds the 8 packed ranks
    nodes = [head()] + [gpu_node(i, gpus=4) for i in range(1, 5)]
    with pytest.raises(PlanError, match="learner node 0.*STRICT_PACK.*need 8 GPU"):
        _plan(nodes, learner_ranks=8, actor_replicas=4, envservers=1)


def test_learner_over_two_nodes_and_uneven_split():
    nodes = [head()] + [gpu_node(i) for i in range(1, 4)]
    plan = _plan(nodes, learner_ranks=16, learner_nodes=2, actor_replicas=8)
    groups = plan.learner_groups()
    assert [len(g) for g in groups] == [8, 8]
    assert len({g[0].node_id for g in groups}) == 2
    assert [s.local_rank for s in groups[1]] == list(range(8))
    assert [s.index for s in groups[1]] == list(range(8, 16))
    with pytest.raises(PlanError, match="cannot be split evenly"):
        _plan(nodes, learner_ranks=6, learner_nodes=4)


def test_envservers_fall_back_to_gpu_nodes_without_cpu_nodes_and_say_so():
    nodes = [head(cpus=1), gpu_node(1)]  # the head's one CPU goes to nats-server
    plan = _plan(nodes, learner_ranks=1, actor_replicas=1, envservers=2, cpus_nats=1)
    assert {s.node_id for s in plan.envservers} == {"gpu0001bbbb"}
    assert plan.notes and "spare CPUs of GPU nodes" in plan.notes[0]


def test_cpu_shortage_names_the_role():
    nodes = [head(cpus=2), gpu_node(1, gpus=8, cpus=8)]
    with pytest.raises(PlanError, match="actor replica 1"):
        _plan(nodes, actor_replicas=2, cpus_per_learner_rank=4, cpus_per_actor=4)


def test_a_custom_resource_stands_in_for_gpus():
    """The acceptance test's cluster: a head (CPU) and one node with {"gpu_node": 2}."""
    nodes = [
        Node("h", "127.0.0.1", {"CPU": 2, HEAD_RESOURCE: 1}, is_head=True),
        Node("g", "127.0.0.1", {"CPU": 2, "gpu_node": 2}),
    ]
    plan = _plan(nodes, gpu_resource="gpu_node", actor_replicas=1, cpus_nats=0, **ONE_CPU_EACH)
    assert (plan.nats.node_id, plan.envservers[0].node_id) == ("h", "h")
    assert plan.learner[0].node_id == plan.actors[0].node_id == "g"
    assert plan.actors[0].bundle == {"CPU": 1, "gpu_node": 1}
    ports = fixed_ports(plan, BASES)
    argv = commands(plan, ports, config_path=Path("c.toml"), run_dir=Path("r"), args=[])
    assert not any("device=cuda" in arg for line in argv.values() for arg in line)  # no GPUs
    with pytest.raises(PlanError, match="needs 3 gpu_node"):
        _plan(nodes, gpu_resource="gpu_node", actor_replicas=2)


def test_from_ray_reads_a_ray_nodes_entry():
    entry = {
        "NodeID": "abc",
        "NodeManagerAddress": "10.1.2.3",
        "Alive": True,
        "Resources": {"CPU": 4.0, "GPU": 2.0, HEAD_RESOURCE: 1.0, "node:10.1.2.3": 1.0},
    }
    node = Node.from_ray(entry)
    assert (node.node_id, node.ip, node.is_head, node.resources["GPU"]) == (
        "abc",
        "10.1.2.3",
        True,
        2.0,
    )


BASES = {
    "nats": 4222,
    "envserver": 50051,
    "envserver_metrics": 9400,
    "actor_metrics": 9500,
    "learner_metrics": 9300,
    "weight_store": 29650,
    "master": 29500,
}
"""The roles' default ports (what port_bases gives for the shipped configs)."""


# ---- ports, commands, environment ----------------------------------------------------------------


def _same_host_plan():
    nodes = [
        Node("h", "127.0.0.1", {"CPU": 8, HEAD_RESOURCE: 1}, is_head=True),
        Node("g", "127.0.0.1", {"CPU": 8, "GPU": 4}),
    ]
    return _plan(nodes, learner_ranks=2, actor_replicas=2, envservers=2, **ONE_CPU_EACH)


def test_ports_count_up_per_host_from_the_roles_bases():
    plan = _same_host_plan()
    ports = fixed_ports(plan, BASES)
    assert ports["nats"] == {"nats": 4222}
    assert ports["envserver-0"] == {"envserver": 50051, "envserver_metrics": 9400}
    assert ports["envserver-1"] == {"envserver": 50052, "envserver_metrics": 9401}
    assert ports["learner-0"] == {"learner_metrics": 9300, "weight_store": 29650, "master": 29500}
    assert "learner-1" not in ports  # no port of its own (not its node's first rank)
    assert [ports[f"actor-{i}"]["actor_metrics"] for i in range(2)] == [9500, 9501]
    every = [p for kinds in ports.values() for p in kinds.values()]
    assert len(every) == len(set(every)) == len(port_needs(plan))
    assert ports_per_host(plan) == {"127.0.0.1": len(every)}
    pooled = ports_from_pools(plan, {"127.0.0.1": list(range(40000, 40000 + len(every)))})
    assert sorted(p for kinds in pooled.values() for p in kinds.values()) == list(
        range(40000, 40000 + len(every))
    )


def test_ports_on_different_hosts_start_from_the_base_each():
    plan = _plan([head(), gpu_node(1), gpu_node(2), gpu_node(3), cpu_node(1)], **DEMAND)
    ports = fixed_ports(plan, BASES)
    on_first = [s for s in plan.actors if s.node_id == plan.actors[0].node_id]
    assert ports[on_first[0].name]["actor_metrics"] == 9500
    assert ports[on_first[1].name]["actor_metrics"] == 9501


def test_commands_are_the_console_scripts_with_the_wiring_and_own_ports(tmp_path):
    plan = _same_host_plan()
    ports = fixed_ports(plan, BASES)
    run_dir, model = tmp_path / "run", tmp_path / "model"
    args = base_wiring(plan, ports, run_dir, model) + ["learner.total_steps=3"]
    config = REPO / "configs" / "demo.toml"
    argv = commands(plan, ports, config_path=config, run_dir=run_dir, args=args)
    assert argv["nats"][:4] == ["python", "-m", "broker", "serve"]
    assert argv["nats"][-2:] == ["--store-dir", str(run_dir / "nats")]
    assert argv["actor-1"][:3] == ["python", "-m", "actors.cli"]
    assert argv["actor-1"][3:7] == ["--config", str(config), "--replicas", "1"]
    assert argv["actor-1"][-5:] == [
        "actor.metrics_host=127.0.0.1",
        "actor.metrics_port=9501",
        "actor.agent_endpoint.host=127.0.0.1",  # agent workflows on other nodes call it
        "actor.agent_endpoint.advertise_host=127.0.0.1",
        "actor.engine.device=cuda",  # the plan gave it a GPU: no silent CPU engine
    ]
    assert argv["learner-1"][-1] == "learner.device=cuda"
    assert not any("device" in arg for arg in argv["envserver-1"] + argv["nats"])
    assert argv["envserver-1"][-1] == "envserver.metrics_port=9401"
    assert "learner.weight_sync.store_host=127.0.0.1" in argv["learner-1"]
    assert 'actor.env.addresses=["127.0.0.1:50051","127.0.0.1:50052"]' in args
    assert "broker.url=nats://127.0.0.1:4222" in args
    # every process's command line is a valid config for every role
    for name, line in argv.items():
        if name == "nats":
            continue
        overrides = line[line.index("--config") + 2 :]
        if overrides[:1] == ["--replicas"]:
            overrides = overrides[2:]
        assert all("=" in o for o in overrides), name  # no option after an override
        run = load_run_config(config, overrides)
        assert run.learner.total_steps == 3
    # binding every interface instead of the node's IP
    anywhere = commands(
        plan, ports, config_path=config, run_dir=run_dir, args=args, bind_host="0.0.0.0"
    )
    assert "envserver.host=0.0.0.0" in anywhere["envserver-0"]
    assert "learner.weight_sync.store_host=127.0.0.1" in anywhere["learner-0"]  # an address


def test_learner_env_is_torchruns_with_a_nodes_gpus_visible_to_each_rank():
    plan = _same_host_plan()
    ports = fixed_ports(plan, BASES)
    env = learner_env(plan, ports, {"learner-0": ["3"], "learner-1": ["1"]})
    assert env["learner-0"]["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["learner-0"]["LOCAL_RANK"] == "1"  # its GPU, 3, is the second visible one
    assert env["learner-1"]["LOCAL_RANK"] == "0"
    assert env["learner-1"]["RANK"] == "1" and env["learner-1"]["WORLD_SIZE"] == "2"
    assert env["learner-1"]["MASTER_ADDR"] == "127.0.0.1"
    assert env["learner-1"]["MASTER_PORT"] == "29500"
    cpu = learner_env(plan, ports)  # no GPUs (a custom resource stands in)
    assert "CUDA_VISIBLE_DEVICES" not in cpu["learner-1"]
    assert cpu["learner-1"]["LOCAL_RANK"] == "1"


def test_metrics_targets_name_each_host():
    plan = _plan([head(), gpu_node(1), gpu_node(2), gpu_node(3), cpu_node(1)], **DEMAND)
    targets = metrics_targets(plan, fixed_ports(plan, BASES))
    assert len(targets["actor"]) == 12 and len(targets["envserver"]) == 2
    assert targets["learner"][0].endswith(":9300")
    assert all(t.startswith("10.0.") for job in targets.values() for t in job)


def test_the_plan_of_a_run_config():
    run = load_run_config(
        REPO / "configs" / "demo.toml",
        [
            "learner.model_path=/m",
            "learner.eval_data=/e.jsonl",
            "actor.engine.model=/m",
            "learner.nproc=4",
            "ray.actor_replicas=3",
            "actor.engine.tensor_parallel_size=2",
        ],
    )
    assert gpus_per_actor(run) == 2.0
    assert port_bases(run) == BASES
    nodes = [head()] + [gpu_node(i) for i in range(1, 3)]
    plan = plan_run(run, nodes)
    assert (len(plan.learner), len(plan.actors)) == (4, 3)
    assert plan.actors[0].bundle == {"CPU": 4.0, "GPU": 2.0}
    assert gpus_per_actor(load_run_config(None, ["ray.gpus_per_actor=0.5"])) == 0.5


def test_records_of_a_prepared_run_name_its_actors_groups_and_passed_environment(tmp_path):
    plan = _same_host_plan()  # both learner ranks on one node: one learner group
    ports = fixed_ports(plan, BASES)
    run = load_run_config(None, ["ray.namespace=ns", "restarts.budget=5"])
    run_dir = tmp_path / "20250101-000000"
    prepared = Prepared(run, plan, [], run_dir, ports, {"nats": ["python"]})
    assert pg_names(plan) == ["envservers", "learner-0", "actors"]
    state = run_state(prepared, "10.0.0.1:6379")
    assert state["supervisor"] == "20250101-000000/supervisor"
    assert state["actors"][0] == "20250101-000000/nats"
    assert state["placement_groups"][1] == "ns/20250101-000000/learner-0"
    assert state["envserver_addresses"] == ["127.0.0.1:50051", "127.0.0.1:50052"]
    assert metrics_ports(prepared)["actor_replicas"] == 2
    environ = {"WANDB_API_KEY": "k", "NCCL_DEBUG": "INFO", "PATH": "/bin", "XWANDB_": "no",
               "TORCH_NCCL_NONBLOCKING_TIMEOUT": "90", "TORCH_HOME": "/t"}  # fmt: skip
    spec = launch_spec(prepared, environ=environ, cwd=Path("/repo"))
    assert spec["env"] == {
        "WANDB_API_KEY": "k", "NCCL_DEBUG": "INFO", "TORCH_NCCL_NONBLOCKING_TIMEOUT": "90"
    }  # fmt: skip
    assert spec["events"] == str(run_dir / "events.jsonl")
    assert (spec["run_id"], spec["namespace"], spec["cwd"]) == ("20250101-000000", "ns", "/repo")
    assert (spec["nats_port"], spec["restarts"]["budget"]) == (4222, 5)
