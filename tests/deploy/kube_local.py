"""Rendered Kubernetes pods as local processes: the pure parts of the manifest smoke run
(test_k8s_smoke.py), each with its unit test in test_kube_local.py.

    objects ──loopback_plan──► every cluster DNS name -> 127.0.0.1, every port -> a free one
    container ──container_env──► env (values, ConfigMap/Secret refs, pod fields resolved)
              ──expand_refs────► command and args with $(VAR) as the kubelet expands them
    text ──rewrite──► the same text with hosts, ports and mount paths made local

The rewrite rules are deliberately narrow: a host is replaced only as a whole DNS name; a
port only after a loopback host (`127.0.0.1:4222`) or as the value of a key ending in
`port` (`metrics_port = 9300`, `--port=50051`); a mount path only as a whole leading path
component. A config line that matches none of them is left exactly as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"
ANY_ADDRESS = "0.0.0.0"
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class LoopbackPlan:
    hosts: dict[str, str]
    """Cluster DNS name (and 0.0.0.0) -> 127.0.0.1."""
    ports: dict[int, int]
    """Container or Service port -> the free local port that stands for it."""


def _qualified(name: str, namespace: str) -> list[str]:
    """A name and the longer forms that resolve to it inside the namespace."""
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc"] + [
        f"{name}.{namespace}.svc.{CLUSTER_DOMAIN}"
    ]


def cluster_hostnames(objects: Iterable[dict]) -> set[str]:
    """Every DNS name the objects give pods: Services, and the per-pod names of Indexed
    Jobs (`<job>-<i>.<subdomain>`) and StatefulSets (`<sts>-<i>.<serviceName>`)."""
    names: set[str] = set()
    for obj in objects:
        namespace = obj["metadata"].get("namespace", "default")
        name, kind, spec = obj["metadata"]["name"], obj["kind"], obj.get("spec", {})
        if kind == "Service":
            names.update(_qualified(name, namespace))
        elif kind == "Job" and spec.get("completionMode") == "Indexed":
            subdomain = spec["template"]["spec"].get("subdomain")
            if subdomain:
                for i in range(spec.get("completions", 1)):
                    names.update(_qualified(f"{name}-{i}.{subdomain}", namespace))
        elif kind == "StatefulSet":
            for i in range(spec.get("replicas", 1)):
                names.update(_qualified(f"{name}-{i}.{spec['serviceName']}", namespace))
    return names


def _pod_specs(objects: Iterable[dict]) -> list[dict]:
    return [
        o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")
    ]


def loopback_plan(objects: list[dict], free_port: Callable[[], int]) -> LoopbackPlan:
    """Map every cluster host to loopback and every port to its own free one, consistently:
    a Service port gets the free port of the container port it targets."""
    hosts = {name: LOOPBACK for name in cluster_hostnames(objects)}
    hosts[ANY_ADDRESS] = LOOPBACK
    ports: dict[int, int] = {}
    given: set[int] = set()

    def distinct_free_port() -> int:
        # free_port() closes the port it found: called twice it can answer the same one,
        # and two containers were then planned on one port (an HTTP probe met nats-server).
        while (port := free_port()) in given:
            pass
        given.add(port)
        return port

    named: dict[str, int] = {}
    for spec in _pod_specs(objects):
        for container in spec["containers"] + spec.get("initContainers", []):
            for port in container.get("ports", []):
                number = port["containerPort"]
                if number not in ports:
                    ports[number] = distinct_free_port()
                if "name" in port:
                    named.setdefault(port["name"], number)
    for service in (o for o in objects if o["kind"] == "Service"):
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            target = named[target] if isinstance(target, str) else target
            if target not in ports:
                raise ValueError(
                    f"Service {service['metadata']['name']}: no container port {target}"
                )
            if ports.setdefault(port["port"], ports[target]) != ports[target]:
                raise ValueError(f"port {port['port']} means two different container ports")
    return LoopbackPlan(hosts=hosts, ports=ports)


def _host_pattern(hosts: Iterable[str]) -> re.Pattern:
    alternatives = "|".join(re.escape(h) for h in sorted(hosts, key=len, reverse=True))
    # A whole DNS name: not a part of a longer name on either side.
    return re.compile(rf"(?<![\w.-])(?:{alternatives})(?![\w-]|\.\w)")


def rewrite(text: str, plan: LoopbackPlan, mounts: dict[str, str] | None = None) -> str:
    """`text` with cluster hosts on loopback, ports on their free stand-ins, and each mount
    path (`/inputs`, ...) on the local directory that stands for the volume."""
    if plan.hosts:
        text = _host_pattern(plan.hosts).sub(lambda m: plan.hosts[m.group(0)], text)

    def port(match: re.Match) -> str:
        number = int(match.group("port"))
        return match.group("head") + str(plan.ports.get(number, number))

    # One pass each, so that nothing replaced is replaced again.
    heads = rf"{re.escape(LOOPBACK)}:|\b[\w-]*port\s*[=:]\s*"
    text = re.sub(rf"(?P<head>{heads})(?P<port>\d+)\b", port, text, flags=re.I)
    if mounts:
        paths = "|".join(re.escape(m) for m in sorted(mounts, key=len, reverse=True))
        pattern = rf"(?<![\w./-])(?:{paths})(?=/|$|[\"'\s,\]])"
        text = re.sub(pattern, lambda m: mounts[m.group(0)], text, flags=re.M)
    return text


def expand_refs(text: str, env: dict[str, str]) -> str:
    """`$(VAR)` as the kubelet expands command, args and env values: replaced when VAR is
    defined, kept as written otherwise; `$$` is a literal `$`."""

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, text)


def container_env(
    container: dict,
    *,
    configmaps: dict[str, dict[str, str]],
    secrets: dict[str, dict[str, str]],
    fields: dict[str, str],
) -> dict[str, str]:
    """The container's environment as the kubelet builds it: literal values (with
    references to variables defined above them expanded), ConfigMap and Secret keys
    (an optional one that is missing is left out), and downward-API fields."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            env[name] = expand_refs(item["value"], env)
            continue
        source = item["valueFrom"]
        if "fieldRef" in source:
            env[name] = fields[source["fieldRef"]["fieldPath"]]
            continue
        for ref_kind, store in (("configMapKeyRef", configmaps), ("secretKeyRef", secrets)):
            if ref_kind in source:
                ref = source[ref_kind]
                value = store.get(ref["name"], {}).get(ref["key"])
                if value is None and not ref.get("optional", False):
                    raise KeyError(f"{ref_kind} {ref['name']}/{ref['key']} for {name} is missing")
                if value is not None:
                    env[name] = value
                break
        else:
            raise ValueError(f"env {name}: unsupported source {sorted(source)}")
    return env
