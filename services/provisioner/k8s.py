"""The `kubernetes` backend: a cluster is a gang of pods in one kubeconfig context (a "region").

The official `kubernetes` client is synchronous: each call runs in a worker thread, bounded by
a timeout, and an ApiException becomes a classified ProvisionError (k8s_errors.py). What the
pods look like is k8s_manifest.py; what fits where is events/k8s_capacity.py.

- launch: all or nothing. The headless Service and every pod are created (a pod that already
  exists with this launch token is adopted: a redelivered placement launches nothing new), then
  polled until every pod is Running with an IP, within the provision timeout. A pod that cannot
  be scheduled (its FailedScheduling Events), fails or is evicted, or the timeout, deletes the
  whole gang and raises the classified failure, so the optimizer fails over; a transient API
  error leaves the pods for the provisioner's next try to adopt (it terminates them when the
  tries run out).
- stop/start: pods cannot be stopped (as in SkyPilot): refused as unsupported; `down` deletes.
- secrets: the cluster's own bus credentials (a deployment's) are a Secret of the cluster's
  (created before the pods, replaced when one of an earlier try is there), read by the pods'
  `secretKeyRef`; it is deleted with the cluster's pods and Service, never left behind.
- terminate: every object labelled with the cluster, waited for until gone (bounded).
- list_owned: every pod labelled with the stage, in every enabled context (reconciliation); a
  context that does not answer is reported (PartialListing) and the others are still listed.
- namespaces: a team whose workspace names one (teamcreds.py) has an adapter of its own
  (`in_namespace`) whose every object is made, read and deleted there instead of the context's
  namespace. The default adapter lists, for reconciliation, its own namespace and those teams have
  named (`also_list`), and deletes an orphan in the namespace it was listed in.
- list_owned_objects / delete_objects: the stage's labelled Services and Secrets, the same
  contexts, so reconciliation finds those of a launch that died before its pods (what is an
  orphan is decided in reconcile.py); one is deleted only while its cluster has no pod.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from skypurza.events import naming
from skypurza.events.k8s_capacity import ContextCapacity, parse_instance_type, pod_size
from skypurza.events.k8s_config import KubernetesSettings, client_for, enabled_contexts, namespace_for, read_capacity
from skypurza.events.natscreds import credentials_env

from . import k8s_errors, k8s_manifest
from .adapter import (
    ClusterRef,
    Failure,
    FailureKind,
    FailureScope,
    FatalProvisionError,
    LaunchSpec,
    NodeInfo,
    NodeState,
    ObjectListing,
    OwnedObject,
    PartialListing,
    ProvisionError,
    ReleaseReport,
    provision_error,
)

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0
GONE_TIMEOUT_S = 120.0
_PHASES = {"Pending": NodeState.PENDING, "Running": NodeState.RUNNING, "Succeeded": NodeState.TERMINATED,
           "Failed": NodeState.TERMINATED}


class KubernetesAdapter:
    infra = "kubernetes"

    def __init__(self, settings: KubernetesSettings | None = None, *, nats_url: str = "", stage: str = "",
                 poll_s: float = 0.5, agent_env: Mapping[str, str] | None = None,
                 client_factory: Callable[[str], Any] | None = None, namespace: str | None = None) -> None:
        self.settings = settings or KubernetesSettings.load()
        self.fixed_namespace = namespace  # a team's (teamcreds.py); None: each context's own
        self._also: frozenset[str] = frozenset()  # more namespaces reconciliation lists
        self._where: dict[tuple[str, str, str], str] = {}  # (context, kind, name) -> namespace it was listed in
        self.nats_url = nats_url
        self.stage = stage
        self.poll_s = poll_s
        self.agent_env = dict(agent_env or {})
        self._factory = client_factory or (lambda ctx: client_for(self.settings, ctx))
        self._clients: dict[str, Any] = {}
        self._namespaces: dict[str, str] = {}

    # ------------------------------------------------------------------ plumbing

    def _core(self, context: str) -> Any:
        import kubernetes

        if context not in self._clients:
            self._clients[context] = self._factory(context)
        return kubernetes.client.CoreV1Api(self._clients[context])

    def contexts(self) -> list[str]:
        return enabled_contexts(self.settings)

    def in_namespace(self, namespace: str) -> "KubernetesAdapter":
        """This backend for a team whose objects go in `namespace` (the same contexts, settings, bus)."""
        return KubernetesAdapter(self.settings, nats_url=self.nats_url, stage=self.stage, poll_s=self.poll_s,
                                 agent_env=self.agent_env, client_factory=self._factory, namespace=namespace)

    def also_list(self, namespaces: Collection[str]) -> None:
        """Reconciliation lists these namespaces too, in every context (teams' own, from the log)."""
        self._also = frozenset(namespaces)

    def _listed_namespaces(self, context: str) -> list[str]:
        own = self.namespace(context)
        return [own] + sorted(self._also - {own})

    def namespace(self, context: str) -> str:
        if self.fixed_namespace:
            return self.fixed_namespace
        if context not in self._namespaces:  # read once: the launch loop polls every poll_s
            self._namespaces[context] = namespace_for(self.settings, context)
        return self._namespaces[context]

    async def _call(self, context: str, fn: Callable[..., Any], *args: Any, ok: Collection[int] = (),
                    **kwargs: Any) -> Any:
        """One API call in a thread, bounded; an answer in `ok` (409, 404) is returned as None."""
        import kubernetes

        try:
            return await asyncio.wait_for(asyncio.to_thread(fn, *args, _request_timeout=CALL_TIMEOUT_S, **kwargs),
                                          CALL_TIMEOUT_S + 5)
        except kubernetes.client.ApiException as exc:
            if exc.status in ok:
                return None
            failure = k8s_errors.api_failure(exc.status, str(exc.reason or ""), _message(exc))
            raise provision_error(failure, infra=self.infra, region=context) from None
        except (asyncio.TimeoutError, OSError) as exc:
            failure = k8s_errors.api_failure(None, "", f"the API server of context {context!r} did not answer: {exc}")
            raise provision_error(failure, infra=self.infra, region=context) from None
        except Exception as exc:  # urllib3's MaxRetryError and friends: the server is away
            if type(exc).__module__.startswith("urllib3"):
                failure = k8s_errors.api_failure(None, "", f"context {context!r}: {exc}")
                raise provision_error(failure, infra=self.infra, region=context) from None
            raise

    async def _pods(self, context: str, selector: Mapping[str, str], namespace: str | None = None
                    ) -> list[dict[str, Any]]:
        core = self._core(context)
        ns = namespace or self.namespace(context)
        got = await self._call(context, core.list_namespaced_pod, ns, label_selector=_selector(selector))
        return [_plain(core, p) for p in got.items]

    async def _events(self, context: str) -> list[dict[str, Any]]:
        """The namespace's FailedScheduling Events (the rest of why a pod fails is in its status)."""
        core = self._core(context)
        got = await self._call(context, core.list_namespaced_event, self.namespace(context),
                               field_selector="reason=FailedScheduling")
        return [_plain(core, e) for e in got.items]

    async def capacity(self, context: str) -> ContextCapacity:
        core = self._core(context)
        return await self._call(context, lambda _request_timeout: read_capacity(core.api_client, context))

    # ------------------------------------------------------------------ launch

    def _env(self, spec: LaunchSpec) -> dict[str, str]:
        """The agent's settings (plain values in the pod spec)."""
        return dict(self.agent_env)

    def _secret_env(self, spec: LaunchSpec) -> dict[str, str]:
        """In a deployment, the cluster's own bus user (never the shared agent's or the control
        plane's: a pod holds what its cluster may do, no more), kept in the cluster's Secret."""
        return credentials_env(spec.bus_credentials) if spec.bus_credentials is not None else {}

    def plan(self, spec: LaunchSpec, capacity: ContextCapacity | None) -> k8s_manifest.PodPlan:
        size = parse_instance_type(spec.instance_type) or pod_size(None, None, None, None, None)
        labels: tuple[tuple[str, str], ...] = ()
        taints: tuple[Mapping[str, Any], ...] = ()
        if size.gpu and capacity is not None:
            labels = tuple(capacity.gpu_labels(size.gpu))
            taints = tuple(t for n in capacity.nodes if n.gpu == size.gpu for t in n.taints)
        options = dict(getattr(spec, "options", {}) or {})
        pod_config = k8s_manifest.merge_pod_config(self.settings.pod_config, options.get("pod_config") or {})
        return k8s_manifest.PodPlan(
            stage=spec.stage, cluster=spec.cluster, namespace=self.namespace(spec.region), launch_token=spec.launch_token,
            num_nodes=spec.num_nodes, size=size, image=self.settings.image, nats_url=self.nats_url, context=spec.region,
            gpu_labels=labels, gpu_taints=taints, pod_config=pod_config, env=self._env(spec),
            secret_env=self._secret_env(spec), job_id=spec.job_id,
            start_seq=str(spec.labels["start_seq"]) if spec.labels.get("start_seq") else None)

    async def launch(self, spec: LaunchSpec) -> list[NodeInfo]:
        context = spec.region
        if context not in self.contexts():
            raise provision_error(Failure(FailureKind.UNSUPPORTED, FailureScope.REGION, "UnknownContext",
                                          f"context {context!r} is not enabled here",
                                          hint="kubernetes.allowed_contexts in config.yaml"), infra=self.infra,
                                  region=context)
        cluster_sel = naming.k8s_labels(spec.stage, spec.cluster)
        existing = await self._pods(context, cluster_sel)
        if existing and any(_label(p, naming.K8S_LABEL_LAUNCH_TOKEN) != spec.launch_token for p in existing):
            await self._delete_cluster(context, spec.stage, spec.cluster)  # an earlier attempt's leftovers
            existing = []
        size = parse_instance_type(spec.instance_type)
        capacity = await self.capacity(context) if size is not None and size.gpu else None
        plan = self.plan(spec, capacity)
        if plan.size.gpu and not plan.gpu_labels:
            raise provision_error(Failure(FailureKind.UNSUPPORTED, FailureScope.REGION, "GpuNotInContext",
                                          f"no node of context {context!r} has a {plan.size.gpu} GPU label",
                                          hint=k8s_errors.LABEL_HINT), infra=self.infra, region=context,
                                  instance_type=spec.instance_type)
        core = self._core(context)
        try:
            await self._call(context, core.create_namespaced_service, plan.namespace,
                             k8s_manifest.service_manifest(plan), ok=(409,))
            await self._put_secret(context, plan)
            have = {p["metadata"]["name"] for p in existing}
            for pod in k8s_manifest.pod_manifests(plan):
                if pod["metadata"]["name"] not in have:
                    await self._call(context, core.create_namespaced_pod, plan.namespace, pod, ok=(409,))
            return await self._wait_running(context, spec, plan)
        except ProvisionError as err:
            if not err.failure.retryable:  # a transient error keeps the pods: the next try adopts them
                await self._rollback(context, spec)
            raise err
        except BaseException:
            await asyncio.shield(self._rollback(context, spec))
            raise

    async def _put_secret(self, context: str, plan: k8s_manifest.PodPlan) -> None:
        """Create the cluster's Secret; one already there (this launch's redelivery, or a try
        that died before its pods) is patched to this launch's credentials."""
        secret = k8s_manifest.secret_manifest(plan)
        if secret is None:
            return
        core = self._core(context)
        made = await self._call(context, core.create_namespaced_secret, plan.namespace, secret, ok=(409,))
        if made is None:
            await self._call(context, core.patch_namespaced_secret, secret["metadata"]["name"], plan.namespace,
                             {"metadata": {"labels": secret["metadata"]["labels"]}, "stringData": secret["stringData"]})

    async def _wait_running(self, context: str, spec: LaunchSpec, plan: k8s_manifest.PodPlan) -> list[NodeInfo]:
        asked = (getattr(spec, "options", {}) or {}).get("provision_timeout")
        # The task's own timeout (config.kubernetes.provision_timeout), bounded like the setting's.
        timeout = min(max(float(asked), 1.0), 86400.0) if isinstance(asked, (int, float)) and not isinstance(
            asked, bool) else self.settings.provision_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout
        token_sel = {**naming.k8s_labels(spec.stage, spec.cluster), naming.K8S_LABEL_LAUNCH_TOKEN: spec.launch_token}
        while True:
            pods = await self._pods(context, token_sel)
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                       and (p.get("status") or {}).get("podIP")]
            if len(running) >= spec.num_nodes:
                return self._nodes(context, running)
            failure = k8s_errors.gang_failure(pods, await self._events(context))
            if failure is not None:
                raise provision_error(failure, infra=self.infra, region=context, instance_type=spec.instance_type)
            if asyncio.get_running_loop().time() >= deadline:
                pending = sorted(p["metadata"]["name"] for p in pods if p not in running)
                raise provision_error(k8s_errors.timeout_failure(timeout, pending), infra=self.infra, region=context,
                                      instance_type=spec.instance_type)
            await asyncio.sleep(self.poll_s)

    async def _rollback(self, context: str, spec: LaunchSpec) -> None:
        try:
            await self._delete_cluster(context, spec.stage, spec.cluster)
        except ProvisionError as exc:  # the launch's own failure is what the caller must see
            log.warning("rolling back %s in %s failed: %s", spec.cluster, context, exc)

    # ------------------------------------------------------------------ the rest of the interface

    async def describe(self, ref: ClusterRef) -> list[NodeInfo]:
        context = ref.region or ""
        pods = await self._pods(context, naming.k8s_labels(ref.stage, ref.cluster))
        return self._nodes(context, pods)

    async def stop(self, ref: ClusterRef) -> list[NodeInfo]:
        # Fatal, so `spz stop` is refused with this line and autostop deletes the pods instead
        # (the provisioner terminates a cluster its backend cannot stop), as SkyPilot does.
        raise FatalProvisionError(Failure(FailureKind.INVALID, FailureScope.REQUEST, "StopNotSupported",
                                          "Kubernetes pods cannot be stopped", hint="use `spz down`"),
                                  infra=self.infra, region=ref.region)

    async def start(self, ref: ClusterRef) -> list[NodeInfo]:
        raise FatalProvisionError(Failure(FailureKind.INVALID, FailureScope.REQUEST, "StartNotSupported",
                                          "Kubernetes pods cannot be restarted", hint="launch again"),
                                  infra=self.infra, region=ref.region)

    async def terminate(self, ref: ClusterRef, *, release: bool = True) -> list[str]:
        return await self._delete_cluster(ref.region or "", ref.stage, ref.cluster)

    async def _delete_cluster(self, context: str, stage: str, cluster: str) -> list[str]:
        core = self._core(context)
        ns = self.namespace(context)
        selector = naming.k8s_labels(stage, cluster)
        pods = await self._pods(context, selector)
        names = sorted(p["metadata"]["name"] for p in pods)
        for name in names:
            await self._call(context, core.delete_namespaced_pod, name, ns, grace_period_seconds=0, ok=(404,))
        await self._call(context, core.delete_namespaced_service, naming.k8s_service(stage, cluster), ns, ok=(404,))
        await self._call(context, core.delete_namespaced_secret, naming.k8s_secret(stage, cluster), ns, ok=(404,))
        deadline = asyncio.get_running_loop().time() + GONE_TIMEOUT_S
        while await self._pods(context, selector):
            if asyncio.get_running_loop().time() > deadline:
                raise provision_error(Failure(FailureKind.TRANSIENT, FailureScope.REQUEST, "DeleteTimeout",
                                              f"pods of {cluster} still there after {GONE_TIMEOUT_S:g}s"),
                                      infra=self.infra, region=context)
            await asyncio.sleep(self.poll_s)
        return names

    async def release_unused(self, stage: str, regions: Iterable[str], *,
                             skip: Collection[str] = ()) -> ReleaseReport:
        return ReleaseReport()  # the Service goes with its cluster: nothing is shared between clusters

    async def list_owned(self, stage: str, regions: Sequence[str] | None = None) -> list[NodeInfo]:
        """Every context is listed, even after one that does not answer: then PartialListing
        carries the pods of the others and why each unanswered one failed."""
        out: list[NodeInfo] = []
        unreachable: dict[str, str] = {}
        self._forget("Pod")
        contexts = self.contexts()
        for context in contexts + sorted(set(regions or ()) - set(contexts)):
            try:
                found = []
                for ns in self._listed_namespaces(context):
                    pods = await self._pods(context, {naming.K8S_LABEL_STAGE: stage}, ns)
                    self._remember(context, "Pod", pods, ns)
                    found += self._nodes(context, pods)
                out.extend(found)
            except Exception as exc:  # away, or gone from the kubeconfig: its pods unknown, not the others'
                unreachable[context] = str(exc) or type(exc).__name__
        if unreachable:
            raise PartialListing(out, unreachable)
        return out

    async def list_owned_objects(self, stage: str, regions: Sequence[str] | None = None) -> ObjectListing:
        """The stage's labelled Services and Secrets in the contexts list_owned lists; a context
        that does not answer is in `unreachable`, the others are still listed."""
        out = ObjectListing()
        self._forget("Service", "Secret")
        contexts = self.contexts()
        selector = _selector({naming.K8S_LABEL_STAGE: naming.check_stage(stage)})
        for context in contexts + sorted(set(regions or ()) - set(contexts)):
            try:
                core = self._core(context)
                found = []
                for ns in self._listed_namespaces(context):
                    for kind, lister in (("Service", core.list_namespaced_service),
                                         ("Secret", core.list_namespaced_secret)):
                        got = await self._call(context, lister, ns, label_selector=selector)
                        plain = [_plain(core, o) for o in got.items]
                        self._remember(context, kind, plain, ns)
                        found += [_object(kind, context, o) for o in plain]
                out.objects.extend(found)
            except Exception as exc:  # away: its objects unknown, not the others'
                out.unreachable[context] = str(exc) or type(exc).__name__
        return out

    async def delete_objects(self, stage: str, objects: Sequence[OwnedObject]) -> list[str]:
        done = []
        deleters = {"Service": "delete_namespaced_service", "Secret": "delete_namespaced_secret"}
        for obj in objects:
            if obj.stage != stage or not obj.cluster or obj.kind not in deleters:
                continue
            ns = self._where.get((obj.region, obj.kind, obj.name)) or self.namespace(obj.region)
            # Checked again right before: a launch of that cluster may have made its pods meanwhile.
            if await self._pods(obj.region, naming.k8s_labels(stage, obj.cluster), ns):
                continue
            core = self._core(obj.region)
            await self._call(obj.region, getattr(core, deleters[obj.kind]), obj.name, ns, ok=(404,))
            done.append(obj.name)
        return done

    async def terminate_nodes(self, stage: str, nodes: Sequence[NodeInfo]) -> list[str]:
        done = []
        clusters: set[tuple[str, str, str]] = set()
        for node in nodes:
            if node.stage != stage or not node.region:
                continue
            ns = self._where.get((node.region, "Pod", node.instance_id)) or self.namespace(node.region)
            core = self._core(node.region)
            await self._call(node.region, core.delete_namespaced_pod, node.instance_id, ns,
                             grace_period_seconds=0, ok=(404,))
            done.append(node.instance_id)
            if node.cluster:
                clusters.add((node.region, ns, node.cluster))
        for context, ns, cluster in sorted(clusters):  # an orphan cluster's Service and Secret go with its last pod
            if not await self._pods(context, naming.k8s_labels(stage, cluster), ns):
                await self._call(context, self._core(context).delete_namespaced_service,
                                 naming.k8s_service(stage, cluster), ns, ok=(404,))
                await self._call(context, self._core(context).delete_namespaced_secret,
                                 naming.k8s_secret(stage, cluster), ns, ok=(404,))
        return done

    def _remember(self, context: str, kind: str, objs: Sequence[Mapping[str, Any]], namespace: str) -> None:
        """Where a listed object is, so deleting it as an orphan goes to that namespace."""
        for o in objs:
            self._where[(context, kind, str((o.get("metadata") or {}).get("name")))] = namespace

    def _forget(self, *kinds: str) -> None:
        """A new listing replaces the last one's places (the map stays as big as one listing)."""
        self._where = {k: v for k, v in self._where.items() if k[1] not in kinds}

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            try:
                await asyncio.to_thread(client.close)
            except Exception:  # closing must not hide why we stop
                log.debug("closing a Kubernetes client failed", exc_info=True)

    # ------------------------------------------------------------------ pods as nodes

    def _nodes(self, context: str, pods: Sequence[Mapping[str, Any]]) -> list[NodeInfo]:
        out = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            status = pod.get("status") or {}
            rank = _label(pod, naming.K8S_LABEL_RANK)
            created = meta.get("creationTimestamp")
            out.append(NodeInfo(
                instance_id=str(meta.get("name")), rank=int(rank) if rank and rank.isdigit() else None,
                state=_PHASES.get(str(status.get("phase")), NodeState.UNKNOWN), region=context, zone=None,
                instance_type=None, private_ip=status.get("podIP"), public_ip=None,
                stage=_label(pod, naming.K8S_LABEL_STAGE), cluster=_label(pod, naming.K8S_LABEL_CLUSTER),
                job_id=_label(pod, naming.K8S_LABEL_JOB), launch_token=_label(pod, naming.K8S_LABEL_LAUNCH_TOKEN),
                state_reason_code=status.get("reason"), state_reason_message=status.get("message"),
                launched_at=_time(created),
            ))
        out.sort(key=lambda n: (n.cluster or "", n.rank if n.rank is not None else 1 << 30, n.instance_id))
        return out


def _object(kind: str, context: str, obj: Mapping[str, Any]) -> OwnedObject:
    meta = obj.get("metadata") or {}
    return OwnedObject(kind=kind, name=str(meta.get("name") or ""), region=context,
                       stage=_label(obj, naming.K8S_LABEL_STAGE), cluster=_label(obj, naming.K8S_LABEL_CLUSTER),
                       created_at=_time(meta.get("creationTimestamp")))


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _label(obj: Mapping[str, Any], key: str) -> str | None:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(key)


def _plain(core: Any, obj: Any) -> dict[str, Any]:
    """A client model as the API's own JSON (camelCase keys), what the pure modules read."""
    return core.api_client.sanitize_for_serialization(obj)


def _time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def _message(exc: Any) -> str:
    import json

    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason or exc)
