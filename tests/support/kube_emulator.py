"""A Kubernetes API server for tests: kmock's KubernetesEmulator with its gaps filled.

No real kube-apiserver runs on these machines (../shared/reference/test-rigs.md), so the fake
stands at the HTTP boundary: the backend talks to this with the official `kubernetes` client,
exactly as to a real cluster. What kmock 0.8 lacks and a real server does, this adds:
- `labelSelector` (equality, `!=`, `in`, `notin`, exists) and `fieldSelector` on lists;
- `metadata.uid`, `resourceVersion`, `creationTimestamp`, `namespace` on create;
- a new pod's `status.phase` is Pending (no scheduler runs until the test plays one);
- `GET /version/` (the client asks with the trailing slash);
- Secrets as the API stores them: `stringData` written (create or patch) lands base64-encoded
  in `data` and is never served back; the Kubelet below resolves `secretKeyRef` from them.
A test can make the server refuse the next pod creations (`refuse_pod_creates`: 500, as an
API server whose etcd is away answers): a launch then stops after its Service and Secret.
Every object a client creates is validated with kubernetes-validate against the newest
upstream schema, strict: a manifest the real server would refuse fails the test here.

It runs on a loop of its own in a daemon thread, so sync tests, the sync client (in worker
threads) and services on other loops all reach it over HTTP. The test plays scheduler and
kubelet through the methods at the end (`run_pod`, `fail_scheduling`, `evict`), which change
objects the way the real ones would (status patches, Event objects).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import kmock
import kubernetes_validate
import yaml
from kmock._internal import rendering

POD = kmock.resource("", "v1", "pods")
SERVICE = kmock.resource("", "v1", "services")
NODE = kmock.resource("", "v1", "nodes")
EVENT = kmock.resource("", "v1", "events")
SECRET = kmock.resource("", "v1", "secrets")
KIND_OF = {"pods": "Pod", "services": "Service", "nodes": "Node", "events": "Event", "secrets": "Secret"}


class InvalidManifest(AssertionError):
    pass


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """Kubernetes' label selector grammar, the parts clients use: k=v, k==v, k!=v, k, !k,
    k in (a,b), k notin (a,b)."""
    if not selector:
        return True
    terms: list[str] = []
    depth, cur = 0, ""
    for ch in selector:
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    terms.append(cur)
    for raw in terms:
        t = raw.strip()
        if not t:
            continue
        if " notin " in t or " in " in t:
            key, op, rest = t.partition(" notin ") if " notin " in t else t.partition(" in ")
            values = {v.strip() for v in rest.strip().strip("()").split(",")}
            has = labels.get(key.strip()) in values
            if (op.strip() == "in") != has:
                return False
        elif "!=" in t:
            key, _, value = t.partition("!=")
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in t:
            key, _, value = t.replace("==", "=").partition("=")
            if labels.get(key.strip()) != value.strip():
                return False
        elif t.startswith("!"):
            if t[1:].strip() in labels:
                return False
        elif t not in labels:
            return False
    return True


def _field(obj: Mapping[str, Any], path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


def field_matches(selector: str, obj: Mapping[str, Any]) -> bool:
    for t in filter(None, (s.strip() for s in (selector or "").split(","))):
        if "!=" in t:
            key, _, value = t.partition("!=")
            if str(_field(obj, key) or "") == value:
                return False
        else:
            key, _, value = t.replace("==", "=").partition("=")
            if str(_field(obj, key) or "") != value:
                return False
    return True


class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with a real server's bookkeeping and a strict manifest check."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback["get /version/"] << self._serve_server_version
        self.rejected: list[str] = []
        self._rv = 0
        self.refuse_pods = 0  # the next pod creations answered 500
        self.pod_creates_refused = 0

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None and request.action == kmock.action.CREATE and isinstance(request.data, dict):
            plural = request.resource.plural or ""
            obj = request.data
            if plural == "pods" and self.refuse_pods > 0:
                self.refuse_pods -= 1
                self.pod_creates_refused += 1
                raise kmock.KubernetesError(status=500, reason="InternalError", message="etcdserver: request timed out")
            obj.setdefault("apiVersion", "v1")
            obj.setdefault("kind", KIND_OF.get(plural, plural.capitalize()))
            if plural in ("pods", "services", "secrets"):  # what our code creates: checked as the real server would
                try:
                    kubernetes_validate.validate(copy.deepcopy(obj), kubernetes_validate.latest_version(), strict=True)
                except kubernetes_validate.ValidationError as exc:
                    self.rejected.append(f"{plural}: {exc}")
                    raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
            meta = obj.setdefault("metadata", {})
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if plural == "pods":
                obj.setdefault("status", {}).setdefault("phase", "Pending")
        if request.resource is not None and request.resource.plural == "secrets" \
                and request.action in (kmock.action.CREATE, kmock.action.UPDATE) and isinstance(request.data, dict) \
                and isinstance(request.data.get("stringData"), dict):
            # The API server's own conversion: a write-only field, merged over `data` as base64.
            plain = request.data.pop("stringData")
            request.data["data"] = {**(request.data.get("data") or {}),
                                    **{k: base64.b64encode(str(v).encode()).decode() for k, v in plain.items()}}
        if request.resource is not None and request.action in (kmock.action.CREATE, kmock.action.UPDATE) \
                and isinstance(request.data, dict):
            self._rv += 1
            request.data.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
        return await super()._handle(request)

    async def _serve_list(self, request: rendering.Request) -> Any:
        try:
            payload = await super()._serve_list(request)
        except kmock.KubernetesNotFoundError:
            payload = {"metadata": {}, "items": []}  # a kind with no object yet lists empty, as on a real server
        labels = request.params.get("labelSelector", "")
        fields = request.params.get("fieldSelector", "")
        items = [i for i in payload["items"]
                 if selector_matches(labels, (i.get("metadata") or {}).get("labels") or {})
                 and field_matches(fields, i)]
        plural = request.resource.plural if request.resource is not None else ""
        return {"apiVersion": "v1", "kind": f"{KIND_OF.get(plural or '', 'Object')}List",
                "metadata": {"resourceVersion": str(self._rv)}, "items": items}


class KubeCluster:
    """One emulated cluster (a kubeconfig context), served from a thread; the test plays its
    scheduler and kubelet with the methods below."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.emulator: KubeEmulator | None = None
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=f"kube-{name}")
        self._server: Any = None
        self.on_running: list[Callable[[dict[str, Any]], None]] = []

    def start(self) -> "KubeCluster":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._enter(), self._loop).result(10)
        return self

    async def _enter(self) -> None:
        self.emulator = KubeEmulator()
        await self.emulator.__aenter__()
        self._server = kmock.Server(self.emulator)
        await self._server.__aenter__()
        self.url = str(self._server.url).rstrip("/")

    def stop(self) -> None:
        async def leave() -> None:
            srv = self._server
            if srv is not None:
                try:
                    await srv.__aexit__(None, None, None)
                except RuntimeError:  # kmock's DNS interceptor chain, when clusters stop out of order
                    for part in (srv._managed_client, srv._managed_server):
                        if part is not None:
                            await part.__aexit__(None, None, None)
            if self.emulator is not None:
                await self.emulator.__aexit__(None, None, None)
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(leave(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            assert self.emulator is not None
            async with self.emulator._lock:
                return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    # ------------------------------------------------------------------ reading

    def objects(self, resource: Any, namespace: str | None = None) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            assert self.emulator is not None
            return [copy.deepcopy(obj.raw) for (res, ns, _), obj in self.emulator.objects.items()
                    if res == resource and not obj.deleted and (namespace is None or ns == namespace)]
        return self._call(read)

    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return sorted(self.objects(POD, namespace), key=lambda p: p["metadata"]["name"])

    def services(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.objects(SERVICE, namespace)

    def secrets(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return sorted(self.objects(SECRET, namespace), key=lambda p: p["metadata"]["name"])

    def secret_value(self, namespace: str, name: str, key: str) -> str | None:
        """What a `secretKeyRef` to `name`/`key` resolves to (None: no such Secret or key)."""
        for secret in self.secrets(namespace):
            if secret["metadata"]["name"] == name and key in (secret.get("data") or {}):
                return base64.b64decode(secret["data"][key]).decode()
        return None

    def requests(self) -> list[Any]:
        """Every request the server got (kmock's records: action, resource, namespace, name)."""
        return self._call(lambda: list(self.emulator or ()))

    def refuse_pod_creates(self, times: int) -> None:
        """Answer the next `times` pod creations with a 500 (nothing is created)."""
        def put() -> None:
            assert self.emulator is not None
            self.emulator.refuse_pods = times
        self._call(put)

    def pod_creates_refused(self) -> int:
        assert self.emulator is not None
        return self.emulator.pod_creates_refused

    def rejected(self) -> list[str]:
        assert self.emulator is not None
        return list(self.emulator.rejected)

    # ------------------------------------------------------------------ the cluster's own objects

    def add_node(self, name: str, *, cpus: int = 32, memory_gib: int = 128, gpus: int = 0,
                 labels: Mapping[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> None:
        alloc = {"cpu": str(cpus), "memory": f"{memory_gib}Gi", "pods": "110"}
        if gpus:
            alloc["nvidia.com/gpu"] = str(gpus)
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": dict(labels or {}),
                             "creationTimestamp": _now(), "resourceVersion": "1"},
                "spec": {"taints": taints or []},
                "status": {"allocatable": alloc, "capacity": dict(alloc),
                           "conditions": [{"type": "Ready", "status": "True"}]}}

        def put() -> None:
            assert self.emulator is not None
            self.emulator.objects[NODE, None, name] = node
        self._call(put)

    def _patch(self, resource: Any, namespace: str | None, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        def apply() -> dict[str, Any]:
            assert self.emulator is not None
            key = (resource, namespace, name)
            if key not in self.emulator.objects or self.emulator.objects[key].deleted:
                raise KeyError(name)  # deleted meanwhile: patching would bring a ghost back
            obj = self.emulator.objects[key]
            obj.patch(patch)
            return copy.deepcopy(obj.raw)
        return self._call(apply)

    def _event(self, pod: dict[str, Any], reason: str, message: str, type_: str = "Warning") -> None:
        meta = pod["metadata"]
        ns = meta["namespace"]
        name = f"{meta['name']}.{uuid.uuid4().hex[:12]}"
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": name, "namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": _now()},
                 "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": ns, "uid": meta.get("uid", "")},
                 "reason": reason, "message": message, "type": type_, "count": 1,
                 "firstTimestamp": _now(), "lastTimestamp": _now(),
                 "source": {"component": "default-scheduler"}}

        def put() -> None:
            assert self.emulator is not None
            self.emulator.objects[EVENT, ns, name] = event
        self._call(put)

    # ------------------------------------------------------------------ scheduler and kubelet

    def run_pod(self, pod: dict[str, Any], ip: str = "127.0.0.1", node: str = "node-0") -> dict[str, Any]:
        """What the scheduler and the kubelet do for a pod that fits: bound, started, Running."""
        meta = pod["metadata"]
        patched = self._patch(POD, meta["namespace"], meta["name"], {
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "podIP": ip, "hostIP": ip, "startTime": _now(),
                       "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}})
        for hook in self.on_running:
            hook(patched)
        return patched

    def fail_scheduling(self, pod: dict[str, Any], message: str) -> None:
        """The scheduler cannot place the pod: it stays Pending, PodScheduled False, an Event says why."""
        meta = pod["metadata"]
        self._patch(POD, meta["namespace"], meta["name"], {"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}})
        self._event(pod, "FailedScheduling", message)

    def evict(self, pod: dict[str, Any], message: str = "The node was low on resource: memory.") -> None:
        """The kubelet evicts the pod (node pressure, or the node was drained): Failed, reason Evicted."""
        meta = pod["metadata"]
        self._patch(POD, meta["namespace"], meta["name"],
                    {"status": {"phase": "Failed", "reason": "Evicted", "message": message}})
        self._event(pod, "Evicted", message)

    def schedule(self, decide: Callable[[dict[str, Any]], str | None], *, interval_s: float = 0.02) -> "Scheduler":
        """A background scheduler: every pending pod without a decision gets `decide(pod)`:
        None runs it, a message fails its scheduling with that message."""
        return Scheduler(self, decide, interval_s).start()


class Scheduler:
    def __init__(self, cluster: KubeCluster, decide: Callable[[dict[str, Any]], str | None], interval_s: float) -> None:
        self.cluster = cluster
        self.decide = decide
        self.interval_s = interval_s
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"sched-{cluster.name}")

    def start(self) -> "Scheduler":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                pods = self.cluster.pods()
            except Exception:
                continue
            for pod in pods:
                uid = pod["metadata"].get("uid", "")
                if uid in self.seen or (pod.get("status") or {}).get("phase") != "Pending":
                    continue
                self.seen.add(uid)
                why = self.decide(pod)
                try:
                    if why is None:
                        self.cluster.run_pod(pod)
                    else:
                        self.cluster.fail_scheduling(pod, why)
                except KeyError:
                    pass  # deleted meanwhile

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def write_kubeconfig(path: Path, clusters: Mapping[str, KubeCluster], current: str | None = None) -> Path:
    """A kubeconfig with one context per emulated cluster (context name = cluster name)."""
    names = list(clusters)
    doc = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "current-context": current or names[0],
        "clusters": [{"name": n, "cluster": {"server": c.url}} for n, c in clusters.items()],
        "users": [{"name": f"{n}-user", "user": {"token": "test-token"}} for n in names],
        "contexts": [{"name": n, "context": {"cluster": n, "user": f"{n}-user", "namespace": "default"}}
                     for n in names],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


class Kubelet:
    """A tiny kubelet, to be honest about what runs in a pod: when the test marks a pod Running,
    its container's command (our real node agent) starts as a local process with the pod's env
    (the image's `python3` is this interpreter, HOME a directory of its own); a pod deleted or
    evicted has its process group killed, as the kubelet kills the container."""

    def __init__(self, cluster: KubeCluster, root: Path, env: Mapping[str, str] | None = None) -> None:
        import subprocess
        import sys

        self.cluster = cluster
        self.root = root
        self.env = dict(env or {})
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._python = sys.executable
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name=f"kubelet-{cluster.name}")
        cluster.on_running.append(self._start)
        self._thread.start()

    def _start(self, pod: dict[str, Any]) -> None:
        import os
        import subprocess

        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        argv = list(container["command"])
        if argv and argv[0] == "python3":
            argv[0] = self._python
        home = self.root / name
        home.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), **self.env}
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if "value" in item:
                env[item["name"]] = item["value"]
            elif (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[item["name"]] = (pod.get("status") or {}).get("podIP", "")
            elif ref:
                value = self.cluster.secret_value(pod["metadata"]["namespace"], ref.get("name", ""), ref.get("key", ""))
                if value is None and not ref.get("optional"):
                    # The real kubelet leaves the container waiting: CreateContainerConfigError.
                    (home / "container.log").write_text(f"CreateContainerConfigError: secret {ref} not found\n")
                    return
                if value is not None:
                    env[item["name"]] = value
        with open(home / "container.log", "ab") as out:
            self.procs[name] = subprocess.Popen(argv, env=env, cwd=str(home), stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            try:
                # Gone, or Failed (evicted): never "not yet Running" (a snapshot taken just before
                # the pod was marked Running must not kill the container just started).
                live = {p["metadata"]["name"] for p in self.cluster.pods()
                        if (p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")}
            except Exception:
                continue
            for name in [n for n in self.procs if n not in live]:
                self._kill(name)

    def _kill(self, name: str) -> None:
        import os
        import signal

        proc = self.procs.pop(name, None)
        if proc is None:
            return
        groups = [proc.pid]
        for f in (self.root / name / ".spz-agent" / "run").glob("*.pgid"):  # jobs run in groups of their own
            try:
                groups.append(int(f.read_text().strip()))
            except (OSError, ValueError):
                pass
        for pgid in groups:  # the container's whole process tree, jobs included
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait(5)

    def log(self, name: str) -> str:
        try:
            return (self.root / name / "container.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for name in list(self.procs):
            self._kill(name)
