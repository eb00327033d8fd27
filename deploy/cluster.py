"""`make cluster-up` / `make cluster-down`: bring a Tether run up (or down) on the engine at
hand, which then does placement, restarts and rendezvous.

    python -m deploy.cluster up|down [--target k8s|ray|local] [--overlay dev|gpu|elastic]
                                     [--purge] [-- ARGS for the local launcher]

Targets:
- `k8s`: the kustomize overlay `deploy/k8s/<overlay>` on the current kube context (namespace
  `tether`). Up creates the namespace and the NATS credentials Secret when missing (a random
  password), then applies the rendered overlay; objects of the Prometheus Operator
  (PodMonitor, PrometheusRule) only where the cluster has their CRDs. Down deletes what up
  applied except the PersistentVolumeClaims (checkpoints, inputs, NATS storage) unless
  `--purge`.
- `ray`: `python -m deploy.ray_cluster up|down` (the Ray driver) on `RAY_ADDRESS`.
- `local`: today's single-machine launcher, `python -m deploy.local` (it runs in the
  foreground; Ctrl-C stops it and everything it started).

With no target: k8s when a kube context is set, ray when RAY_ADDRESS is set, else an error
that names the three.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from broker.security import new_secret

REPO_ROOT = Path(__file__).resolve().parent.parent
OVERLAYS_DIR = REPO_ROOT / "deploy" / "k8s"
OVERLAYS = ("dev", "gpu", "elastic")
TARGETS = ("k8s", "ray", "local")
NAMESPACE = "tether"
NATS_SECRET = "tether-nats"
"""Secret with NATS_USER and NATS_PASSWORD (the server's and every client's credentials)."""
MONITORING_GROUP = "monitoring.coreos.com"


def choose_target(explicit: str | None, *, kube_context: bool, ray_address: str | None) -> str:
    """The target to use: the explicit one, else k8s with a kube context, else ray with
    RAY_ADDRESS; raises ValueError naming the three when nothing says which."""
    if explicit:
        if explicit not in TARGETS:
            raise ValueError(f"TARGET must be one of {', '.join(TARGETS)}; got {explicit!r}")
        return explicit
    if kube_context:
        return "k8s"
    if ray_address:
        return "ray"
    raise ValueError(
        "no cluster found: no kube context is set (kubectl config current-context) and "
        "RAY_ADDRESS is not set. Say where with TARGET=k8s (kustomize overlay, "
        "OVERLAY=dev|gpu|elastic), TARGET=ray (a Ray cluster) or TARGET=local (this machine, "
        "like make run)."
    )


def has_kube_context() -> bool:
    if shutil.which("kubectl") is None:
        return False
    result = subprocess.run(
        ["kubectl", "config", "current-context"], capture_output=True, text=True, check=False
    )
    return result.returncode == 0 and bool(result.stdout.strip())


# ---- k8s: the rendered overlay, filtered ---------------------------------------------------


def render(overlay: str) -> list[dict]:
    """The overlay's objects, as `kubectl kustomize` renders them (offline)."""
    if overlay not in OVERLAYS:
        raise ValueError(f"OVERLAY must be one of {', '.join(OVERLAYS)}; got {overlay!r}")
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAYS_DIR / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def select(objects: Iterable[dict], *, monitoring: bool, volumes: bool) -> list[dict]:
    """The objects to apply or delete: without the Prometheus Operator's kinds unless
    `monitoring`, and without PersistentVolumeClaims unless `volumes`."""
    chosen = []
    for obj in objects:
        group = obj["apiVersion"].rpartition("/")[0]
        if group == MONITORING_GROUP and not monitoring:
            continue
        if obj["kind"] == "PersistentVolumeClaim" and not volumes:
            continue
        chosen.append(obj)
    return chosen


def _kubectl(*args: str, stdin: str | None = None, check: bool = True) -> int:
    print("+ kubectl " + " ".join(args), flush=True)
    return subprocess.run(["kubectl", *args], input=stdin, text=True, check=check).returncode


def _quiet_ok(*args: str) -> bool:
    return subprocess.run(["kubectl", *args], capture_output=True, check=False).returncode == 0


def _has_monitoring_crds() -> bool:
    result = subprocess.run(
        ["kubectl", "api-resources", f"--api-group={MONITORING_GROUP}", "-o", "name"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and "podmonitors" in result.stdout


def k8s(action: str, overlay: str, *, purge: bool) -> int:
    objects = render(overlay)
    monitoring = _has_monitoring_crds()
    if not monitoring:
        print(
            "no Prometheus Operator CRDs (monitoring.coreos.com) in this cluster: PodMonitor "
            "and PrometheusRule skipped; pods still carry prometheus.io/* annotations",
            flush=True,
        )
    if action == "up":
        if not _quiet_ok("get", "namespace", NAMESPACE):
            _kubectl("create", "namespace", NAMESPACE)
        if not _quiet_ok("-n", NAMESPACE, "get", "secret", NATS_SECRET):
            # Never in the repo: a fresh random password, kept in the cluster only.
            print(f"+ kubectl -n {NAMESPACE} create secret generic {NATS_SECRET} ...", flush=True)
            subprocess.run(
                ["kubectl", "-n", NAMESPACE, "create", "secret", "generic", NATS_SECRET]
                + ["--from-literal=NATS_USER=tether"]
                + [f"--from-literal=NATS_PASSWORD={new_secret()}"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        chosen = select(objects, monitoring=monitoring, volumes=True)
        return _kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(chosen), check=False)
    chosen = select(objects, monitoring=monitoring, volumes=purge)
    args = ["delete", "--ignore-not-found", "-f", "-"]
    code = _kubectl(*args, stdin=yaml.safe_dump_all(chosen), check=False)
    if purge:  # the NATS StatefulSet's own claims (volumeClaimTemplates) are not rendered
        code |= _kubectl("-n", NAMESPACE, "delete", "pvc", "-l", "app.kubernetes.io/part-of=tether")
    return code


# ---- dispatch --------------------------------------------------------------------------------


def run(action: str, target: str, overlay: str, *, purge: bool, extra: Sequence[str]) -> int:
    if target == "k8s":
        return k8s(action, overlay, purge=purge)
    if target == "ray":
        command = [sys.executable, "-m", "deploy.ray_cluster", action, *extra]
        return subprocess.call(command, cwd=REPO_ROOT)
    if action == "down":
        print("TARGET=local runs in the foreground: Ctrl-C stops it and all it started")
        return 0
    return subprocess.call([sys.executable, "-m", "deploy.local", *extra], cwd=REPO_ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.cluster", description=__doc__)
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--target", choices=TARGETS, default=None)
    parser.add_argument("--overlay", default="dev")
    parser.add_argument("--purge", action="store_true", help="down: delete the volumes too")
    parser.add_argument("extra", nargs="*", help="arguments for the local launcher or Ray")
    # Everything after `--` is passed on as it is (argparse would refuse it after the
    # positional `action`, and would take `--detach` or `--config` for its own options).
    argv = sys.argv[1:] if argv is None else list(argv)
    passed = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    args = parser.parse_args(argv)
    args.extra = [*args.extra, *passed]
    try:
        target = choose_target(
            args.target,
            kube_context=args.target is None and has_kube_context(),
            ray_address=os.environ.get("RAY_ADDRESS"),
        )
        if target == "k8s" and args.overlay not in OVERLAYS:
            raise ValueError(f"OVERLAY must be one of {', '.join(OVERLAYS)}; got {args.overlay!r}")
    except ValueError as e:
        print(f"make cluster-{args.action}: {e}", file=sys.stderr)
        return 2
    print(f"cluster-{args.action}: target {target}", flush=True)
    return run(args.action, target, args.overlay, purge=args.purge, extra=args.extra)


if __name__ == "__main__":
    sys.exit(main())
