"""The objects a Kubernetes cluster of ours is made of, as plain manifests (pure: no client, no I/O).

A cluster of N nodes is N pods (one per node, `restartPolicy: Never`: a pod that dies is a node
lost, as an instance would be) plus one headless Service whose name is every pod's DNS
subdomain, so `<pod>.<service>` resolves to a node's IP. Each pod:
- is labelled with the stage, the cluster, its rank and the launch token (events/naming.py):
  the launch token finds a gang again, the stage is what reconciliation lists;
- requests (and limits) its CPUs, memory and `nvidia.com/gpu`, the size the optimizer placed
  (the candidate's instance type, `4CPU--16GB--H100:1`);
- is steered to the nodes whose GPU label names the GPU asked for (a required node affinity
  over every label value of that GPU in the context: NVIDIA's, GKE's, Karpenter's, EKS's), and
  tolerates GPU taints;
- runs the node agent as its container's command (`python -m skypurza.services.agent ...`,
  the AgentSpec contract) with the bus URL the deployment configures, and the agent settings
  the provisioner has (`PodPlan.env`: events/agentspec.py `agent_settings_env`) in its env;
- reads what is secret (`PodPlan.secret_env`: the cluster's own bus user and password) from the
  cluster's Secret by `valueFrom.secretKeyRef`, never as a plain value a `get pod` would show;
  the Secret carries the cluster's labels and goes with it on `down`;
- then gets the user's `pod_config` merged over it the way SkyPilot merges it (`merge_pod_config`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from skypurza.events import naming
from skypurza.events.agentspec import AgentSpec
from skypurza.events.k8s_capacity import GPU_RESOURCE, PodSize

# Taints GPU node pools carry (GKE and the NVIDIA operator's convention, EKS's GPU AMIs).
GPU_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
    {"key": "cloud.google.com/gke-accelerator", "operator": "Exists", "effect": "NoSchedule"},
)
AGENT_PYTHON = "python3"  # the image's interpreter


@dataclass(frozen=True)
class PodPlan:
    """Everything one gang's pods are built from."""

    stage: str
    cluster: str
    namespace: str
    launch_token: str
    num_nodes: int
    size: PodSize
    image: str
    nats_url: str
    context: str
    gpu_labels: tuple[tuple[str, str], ...] = ()  # (key, value) pairs naming the GPU asked for
    gpu_taints: tuple[Mapping[str, Any], ...] = ()  # taints seen on those nodes
    pod_config: Mapping[str, Any] = field(default_factory=dict)  # config's, then the task's
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, str] = field(default_factory=dict)  # in the cluster's Secret, not the pod spec
    job_id: str | None = None
    start_seq: str | None = None


def labels(plan: PodPlan, rank: int | None = None) -> dict[str, str]:
    out = naming.k8s_labels(plan.stage, plan.cluster)
    out[naming.K8S_LABEL_LAUNCH_TOKEN] = plan.launch_token
    if plan.job_id:
        out[naming.K8S_LABEL_JOB] = plan.job_id
    if rank is not None:
        out[naming.K8S_LABEL_RANK] = str(rank)
    return out


def service_manifest(plan: PodPlan) -> dict[str, Any]:
    """The headless Service: DNS names for the pods, no load balancing, no cluster IP."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": naming.k8s_service(plan.stage, plan.cluster), "namespace": plan.namespace,
                     "labels": labels(plan)},
        "spec": {"clusterIP": "None", "selector": naming.k8s_labels(plan.stage, plan.cluster),
                 "publishNotReadyAddresses": True, "ports": [{"name": "ssh", "port": 22, "protocol": "TCP"}]},
    }


def secret_manifest(plan: PodPlan) -> dict[str, Any] | None:
    """The cluster's Secret (one per cluster, labelled as its pods), or None when nothing is secret.
    `stringData`: the API server stores it base64-encoded under `data`."""
    if not plan.secret_env:
        return None
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": naming.k8s_secret(plan.stage, plan.cluster), "namespace": plan.namespace,
                     "labels": labels(plan)},
        "stringData": dict(sorted(plan.secret_env.items())),
    }


# The kinds of object a cluster holds besides its pods, and the name each has (events/naming.py).
OBJECT_NAMES = {"Service": naming.k8s_service, "Secret": naming.k8s_secret}


def object_name(kind: str, stage: str, cluster: str) -> str | None:
    """The name our `kind` of object of this cluster has (None: not a kind of ours)."""
    make = OBJECT_NAMES.get(kind)
    return make(stage, cluster) if make is not None else None


def agent_command(plan: PodPlan, rank: int) -> list[str]:
    extra = {"start_seq": plan.start_seq} if plan.start_seq else {}
    spec = AgentSpec(nats_url=plan.nats_url, stage=plan.stage, cluster=plan.cluster, rank=rank,
                     num_nodes=plan.num_nodes, instance_id=naming.k8s_pod(plan.stage, plan.cluster, rank),
                     infra="kubernetes", region=plan.context, extra=extra)
    return spec.command(AGENT_PYTHON)


def _quantity(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{int(round(x * 1000))}m"


def resources(size: PodSize) -> dict[str, Any]:
    requests = {"cpu": _quantity(size.cpus), "memory": f"{int(round(size.memory_gib * 1024))}Mi"}
    limits: dict[str, str] = {"memory": requests["memory"]}  # CPU unlimited: throttling slows jobs for nothing
    if size.gpu and size.gpus:
        requests[GPU_RESOURCE] = str(size.gpus)
        limits[GPU_RESOURCE] = str(size.gpus)  # extended resources need limit = request
    return {"requests": requests, "limits": limits}


def gpu_affinity(gpu_labels: Sequence[tuple[str, str]]) -> dict[str, Any] | None:
    """A required node affinity: any node with one of these labels (terms are ORed)."""
    by_key: dict[str, list[str]] = {}
    for key, value in gpu_labels:
        by_key.setdefault(key, [])
        if value not in by_key[key]:
            by_key[key].append(value)
    if not by_key:
        return None
    terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": sorted(v)}]} for k, v in sorted(by_key.items())]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def tolerations(plan: PodPlan) -> list[dict[str, Any]]:
    if not plan.size.gpus:
        return []
    out = [dict(t) for t in GPU_TOLERATIONS]
    for taint in plan.gpu_taints:
        key = taint.get("key")
        if not key or any(t["key"] == key for t in out):
            continue
        tol: dict[str, Any] = {"key": key, "operator": "Equal" if taint.get("value") else "Exists"}
        if taint.get("value"):
            tol["value"] = taint["value"]
        if taint.get("effect"):
            tol["effect"] = taint["effect"]
        out.append(tol)
    return out


def pod_manifest(plan: PodPlan, rank: int) -> dict[str, Any]:
    name = naming.k8s_pod(plan.stage, plan.cluster, rank)
    secret = naming.k8s_secret(plan.stage, plan.cluster)
    plain = {k: v for k, v in {"PYTHONUNBUFFERED": "1", **plan.env}.items() if k not in plan.secret_env}
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(plain.items())]
    env.extend({"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": k}}} for k in sorted(plan.secret_env))
    env.append({"name": "SKYPURZA_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": naming.k8s_service(plan.stage, plan.cluster),
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": naming.K8S_CONTAINER, "image": plan.image, "imagePullPolicy": "IfNotPresent",
            "command": agent_command(plan, rank), "env": env, "resources": resources(plan.size),
        }],
    }
    affinity = gpu_affinity(plan.gpu_labels) if plan.size.gpus else None
    if affinity:
        spec["affinity"] = affinity
    tols = tolerations(plan)
    if tols:
        spec["tolerations"] = tols
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": plan.namespace, "labels": labels(plan, rank)},
           "spec": spec}
    if plan.pod_config:
        pod = merge_pod_config(pod, plan.pod_config)
        # What makes the pod ours is not the user's to change: the name, namespace and our labels.
        pod["metadata"]["name"] = name
        pod["metadata"]["namespace"] = plan.namespace
        pod["metadata"].setdefault("labels", {}).update(labels(plan, rank))
        pod["spec"]["containers"][0]["command"] = agent_command(plan, rank)
    return pod


def pod_manifests(plan: PodPlan) -> list[dict[str, Any]]:
    return [pod_manifest(plan, rank) for rank in range(plan.num_nodes)]


def merge_pod_config(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """SkyPilot's `merge_k8s_configs`: mappings merge key by key; `containers` (and
    `imagePullSecrets`) merge their first item into our first; `volumes`, `volumeMounts`, `env`
    merge items of the same `name` and append the others (an `env` item of the same name replaces
    ours whole: it is one value); any other list is appended; a scalar replaces. Returns a new dict; neither input is changed."""
    out = copy.deepcopy(dict(base))
    _merge(out, override)
    return out


_FIRST_ITEM = ("containers", "imagePullSecrets")
_BY_NAME = ("volumes", "volumeMounts", "env", "ports")


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> None:
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list):
            if key in _FIRST_ITEM and base[key] and value:
                first = value[0]
                if isinstance(first, Mapping) and isinstance(base[key][0], dict):
                    _merge(base[key][0], first)
                base[key].extend(copy.deepcopy(value[1:]))
            elif key in _BY_NAME:
                for item in value:
                    same = next((b for b in base[key] if isinstance(b, dict) and isinstance(item, Mapping)
                                 and item.get("name") is not None and b.get("name") == item.get("name")), None)
                    if same is not None and key == "env":
                        # A variable is one value, `value` or `valueFrom`: the override replaces it
                        # whole (merged, `valueFrom` beside our `value` is refused by the API server).
                        base[key][base[key].index(same)] = copy.deepcopy(dict(item))
                    elif same is not None:
                        _merge(same, item)
                    else:
                        base[key].append(copy.deepcopy(item))
            else:
                base[key].extend(copy.deepcopy(value))
        else:
            base[key] = copy.deepcopy(value)
