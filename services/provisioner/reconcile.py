"""Reconciliation: compare what the clouds hold for this stage with what the log says is alive.

- Live clusters come from the log (ClusterProvisioned minus ClusterTerminated), never from memory.
- Each backend lists what it holds for the stage (`list_owned`; for AWS, every enabled region
  plus the regions of live clusters), and `adapter.find_orphans` compares. A backend that lists
  some regions and not others (a Kubernetes context away) says so (`PartialListing`): each
  unlisted region is an error of its own (`errors["kubernetes/<context>"]`), the others'
  orphans are found in the same pass, and no cluster of an unlisted region is called vanished.
- An orphan (a node no live cluster accounts for) becomes an OrphanFound event, so it is audited;
  with `terminate=True` it is terminated (only nodes tagged with this stage are ever touched) and
  a second OrphanFound with action "terminated" records it. Each (node, action) is recorded once.
- Nodes younger than `grace_s` are never orphans: their launch may still be on its way to the log.
  Clusters this process is launching right now are accepted whatever their nodes.
- A backend whose clusters hold objects besides nodes (Kubernetes: each cluster's headless
  Service and Secret; `ObjectOwner`) lists them too. One whose cluster holds no pod in its
  context (any phase), is not up per the log, is not being launched or torn down by this
  process, and is older than `grace_s`, is an orphan (`orphan_objects`): a launch that died
  between its Service/Secret and its pods, never retried. It is reported and recorded like an
  orphan node (OrphanFound, instance id `service/<name>` or `secret/<name>`) and deleted with
  `terminate=True`. Only objects labelled with this stage and named as events/naming.py names
  that cluster's object are ever candidates: a user's object is never touched. The objects of a
  cluster with orphan pods go with those pods (`terminate_nodes`).
- A vanished cluster (the log knows node ids the cloud no longer holds alive) is reported; the
  recovery service owns what to do about a node lost from a cluster that still runs. When every
  node of a cluster is gone, nothing bills any more and the cluster is over: ClusterTerminated
  (reason "vanished") is published, so status and cost follow the cloud. Its id is derived from
  the cluster's placement, so any number of passes (or two reconcilers) publish it once; clusters
  younger than `grace_s`, or being launched or torn down by this process, are left alone.
- Kubernetes is listed in each context's namespace and in every namespace a team has named
  (teamcreds.py), so a team's orphan pods and objects are found and deleted where they are.
- AWS is listed in every account a node of ours may be in (`_reconcile_aws`): the server's
  default credentials and each profile any team has ever had (teamcreds.py: a profile left
  behind may still hold nodes), one listing per (account, region), `AWS_LISTINGS` at a time, each
  within `AWS_LISTING_TIMEOUT_S`. Each live cluster is compared with the account it was launched
  in (its team's profile as of its ClusterProvisioned), so a team-account cluster whose nodes are
  gone is vanished like any other, and a node of ours in a team's account that no cluster there
  accounts for is an orphan (reported, terminated with that account's credentials). A profile
  the server no longer has, or an account or region that does not answer, is an error of its
  own (`errors["aws@PROFILE"]`, `errors["aws@PROFILE/<region>"]`) and a warning line; its
  clusters are not called vanished (unseen is not gone). A node id the log gives a cluster of
  another account is never an orphan.
- With `terminate=True` the pass also sweeps unused per-stage resources (security groups, key
  pair, placement groups) from every region the stage touched (cleanup.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from skypurza.events import naming
from skypurza.events.bus import Bus
from skypurza.events.clock import SYSTEM_CLOCK, Clock
from skypurza.events.envelope import derive_id
from skypurza.events.models import ClusterProvisioned, ClusterTerminated, OrphanFound

from . import cleanup, k8s_manifest, teamcreds

from .adapter import NodeInfo, ObjectOwner, OwnedObject, PartialListing, find_orphans
from .backends import Backends, UnsupportedInfra, aws_account, credentials_key
from .state import find_event, live_clusters_at

log = logging.getLogger(__name__)

UNKNOWN_CLUSTER = "?"
AWS_LISTINGS = 8  # (account, region) listings at once: DescribeInstances is rate-limited per account
AWS_LISTING_TIMEOUT_S = 60.0  # one listing; a region or account that does not answer is an error of its own


@dataclass
class ReconcileReport:
    checked: dict[str, list[str]] = field(default_factory=dict)  # infra (aws@PROFILE: a team's account) -> regions
    live: list[str] = field(default_factory=list)
    orphans: list[NodeInfo] = field(default_factory=list)
    orphan_objects: list[OwnedObject] = field(default_factory=list)  # a cluster's Service, Secret
    terminated: list[str] = field(default_factory=list)  # node ids, and object ids (object_id)
    vanished: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ended: list[str] = field(default_factory=list)  # vanished entirely: ClusterTerminated published
    cleanup_failed: list[str] = field(default_factory=list)  # resources the sweep could not release
    errors: dict[str, str] = field(default_factory=dict)  # infra -> why it could not be checked

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "live_clusters": self.live,
            "orphans": [
                {"instance_id": n.instance_id, "cluster": n.cluster, "region": n.region, "zone": n.zone,
                 "state": str(n.state), "instance_type": n.instance_type,
                 "launched_at": n.launched_at.isoformat() if n.launched_at else None,
                 "terminated": n.instance_id in self.terminated}
                for n in self.orphans
            ] + [
                {"instance_id": object_id(o), "cluster": o.cluster, "region": o.region, "zone": None,
                 "state": "present", "instance_type": o.kind,
                 "launched_at": o.created_at.isoformat() if o.created_at else None,
                 "terminated": object_id(o) in self.terminated}
                for o in self.orphan_objects
            ],
            "vanished": {c: list(ids) for c, ids in self.vanished.items()},
            "ended": self.ended,
            "cleanup_failed": self.cleanup_failed,
            "errors": self.errors,
        }


def old_enough(nodes: Sequence[NodeInfo], now: datetime, grace_s: float) -> list[NodeInfo]:
    """Pure: the nodes launched at least `grace_s` ago (a node without a launch time counts)."""
    limit = now - timedelta(seconds=grace_s)
    return [n for n in nodes if n.launched_at is None or _aware(n.launched_at) <= limit]


def object_id(obj: OwnedObject) -> str:
    """How an object is named in reports and OrphanFound: `service/<name>`, kubectl's way."""
    return f"{obj.kind.lower()}/{obj.name}"


def orphan_objects(objects: Sequence[OwnedObject], *, stage: str, live: Collection[str],
                   with_nodes: Collection[tuple[str, str]], busy: Collection[str] = (),
                   unlisted: Collection[str] = (), now: datetime, grace_s: float) -> list[OwnedObject]:
    """Pure: the objects no cluster accounts for. Ours only (this stage's label, a cluster
    label, the name events/naming.py gives that cluster's object of that kind), in a region
    whose nodes and objects were both listed; their cluster not up per the log (`live`), not
    launched or torn down by this process (`busy`), with no node of any phase in that region
    (`with_nodes`: (region, cluster)), and older than `grace_s` (no creation time counts)."""
    limit = now - timedelta(seconds=grace_s)
    out = []
    for obj in objects:
        cluster = obj.cluster or ""
        if obj.stage != stage or not cluster or obj.name != k8s_manifest.object_name(obj.kind, stage, cluster):
            continue  # not ours, whatever its labels say
        if obj.region in unlisted or cluster in live or cluster in busy or (obj.region, cluster) in with_nodes:
            continue
        if obj.created_at is not None and _aware(obj.created_at) > limit:
            continue  # its launch may be on its way: Service and Secret come before the pods
        out.append(obj)
    return sorted(out, key=lambda o: (o.region, o.cluster or "", o.kind, o.name))


def ended_clusters(vanished: dict[str, tuple[str, ...]], live: dict[str, ClusterProvisioned],
                   now: datetime, grace_s: float, busy: Collection[str] = ()) -> list[str]:
    """Pure: the vanished clusters that are over: every node the log knows is gone, the cluster
    is older than `grace_s`, and this process is not launching or tearing it down."""
    limit = now - timedelta(seconds=grace_s)
    out = []
    for cluster, gone in vanished.items():
        ev = live.get(cluster)
        if ev is None or cluster in busy or not ev.nodes:
            continue
        if set(gone) >= {n.instance_id for n in ev.nodes} and _aware(ev.launched_at) <= limit:
            out.append(cluster)
    return sorted(out)


def unseen_kept(vanished: dict[str, tuple[str, ...]], live: dict[str, ClusterProvisioned],
                unlisted: Collection[str]) -> dict[str, tuple[str, ...]]:
    """Pure: `vanished` without the clusters of regions that could not be listed: their nodes
    were not seen, which says nothing about whether they are gone."""
    return {c: ids for c, ids in vanished.items()
            if c not in live or live[c].candidate.region not in unlisted}


def expected_nodes(live: dict[str, ClusterProvisioned], infra: str,
                   launching: Collection[str] = ()) -> dict[str, list[str]]:
    """Pure: cluster -> node ids the log knows, for one infra (launching clusters: any node)."""
    out = {c: [n.instance_id for n in ev.nodes] for c, ev in live.items() if ev.candidate.infra == infra}
    for c in launching:
        out[c] = []
    return out


def refresh_infras(live: dict[str, ClusterProvisioned], settings: Any) -> list[str]:
    """What `spz status -r` / `spz reconcile` check (the CLI on the embedded bus and the
    provisioner's `reconcile` query alike): the live clusters' infras, the configured ones, and
    AWS whenever it is configured at all (regions set, or credentials found)."""
    wanted = {ev.candidate.infra for ev in live.values()} | set(settings.reconcile_infras)
    if _aws_configured(settings):
        wanted.add("aws")
    return sorted(wanted)


def _aws_configured(settings: Any) -> bool:
    if settings.aws_regions:
        return True
    try:
        import boto3

        return boto3.session.Session().get_credentials() is not None
    except Exception:
        return False


async def reconcile(
    bus: Bus,
    backends: Backends,
    *,
    terminate: bool = False,
    grace_s: float = 600.0,
    infras: Sequence[str] | None = None,
    launching: Collection[str] = (),
    terminating: Collection[str] = (),
    cleanup_policy: cleanup.RetryPolicy | None = None,
    now: datetime | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> ReconcileReport:
    """`now` (else `clock.now()`): how old an orphan is, when a vanished cluster ended."""
    now = now or clock.now()
    live, seqs = await live_clusters_at(bus)
    report = ReconcileReport(live=sorted(live))
    wanted = list(infras) if infras is not None else sorted(
        {ev.candidate.infra for ev in live.values()} | set(backends.settings.reconcile_infras))
    busy = set(launching) | set(terminating)
    for infra in wanted:
        if infra == "aws":  # every account a node of ours may be in, each its own listing
            await _reconcile_aws(bus, backends, report, live, seqs, launching=launching, busy=busy,
                                 terminate=terminate, now=now, grace_s=grace_s)
            continue
        try:
            backend = backends.get(infra)
            regions: list[str] | None = None
            if infra == "kubernetes":
                # Live clusters' contexts too: one dropped from allowed_contexts still holds pods,
                # which must not read as a vanished cluster (the backend adds its enabled contexts).
                regions = sorted({ev.candidate.region for ev in live.values()
                                  if ev.candidate.infra == infra and ev.candidate.region})
                # Teams' own namespaces too (teamcreds.py): a team's orphans are where it made them.
                also_list = getattr(backend, "also_list", None)
                if also_list is not None:
                    also_list(await teamcreds.team_k8s_namespaces(bus))
            unlisted: set[str] = set()
            try:
                owned = await backend.list_owned(bus.stage, regions)
            except PartialListing as part:  # one region away hides nothing of the others
                owned, unlisted = part.nodes, set(part.unreachable)
                for region, why in sorted(part.unreachable.items()):
                    log.warning("reconcile: listing %s/%s failed: %s", infra, region, why)
                    report.errors[f"{infra}/{region}"] = why
        except UnsupportedInfra as exc:
            report.errors[infra] = str(exc)
            continue
        except Exception as exc:  # one cloud failing must not hide the others
            log.warning("reconcile: listing %s failed: %s", infra, exc)
            report.errors[infra] = f"{type(exc).__name__}: {exc}"
            continue
        report.checked[infra] = [r for r in regions or [] if r not in unlisted]
        if not await _settle(bus, backend, infra, report, owned, expected_nodes(live, infra, launching),
                             live=live, unlisted=unlisted, busy=busy, terminate=terminate, now=now, grace_s=grace_s):
            continue
        if isinstance(backend, ObjectOwner):
            await _reconcile_objects(bus, backend, infra, report, regions=regions, owned=owned, live=live,
                                     unlisted=unlisted, busy=set(launching) | set(terminating), terminate=terminate,
                                     now=now, grace_s=grace_s)
    if terminate:
        await _sweep(bus, backends, report, cleanup_policy or cleanup.RetryPolicy(), now)
    return report


async def _settle(bus: Bus, backend: Any, key: str, report: ReconcileReport, owned: Sequence[NodeInfo],
                  expected: dict[str, list[str]], *, live: dict[str, ClusterProvisioned], unlisted: Collection[str],
                  busy: Collection[str], terminate: bool, now: datetime, grace_s: float,
                  known: Collection[str] = ()) -> bool:
    """One listing (an infra, or one AWS account: `key`) against the clusters it should hold:
    vanished clusters reported (and ended when wholly gone), orphans recorded and, with
    `terminate`, terminated. `known`: node ids the log gives clusters of other accounts, never
    orphans here. False when terminating failed (an error of `key`)."""
    orphans, vanished = find_orphans(owned, expected)
    vanished = unseen_kept(vanished, live, unlisted)
    orphans = [n for n in old_enough(orphans, now, grace_s) if n.instance_id not in known]
    report.vanished.update(vanished)
    for cluster, ids in vanished.items():
        log.warning("reconcile: cluster %s lost node(s) %s", cluster, ", ".join(ids))
    for cluster in ended_clusters(vanished, live, now, grace_s, busy):
        await end_vanished(bus, live[cluster], vanished[cluster], now)
        report.ended.append(cluster)
    for node in orphans:
        await record_orphan(bus, node, key, "reported")
    report.orphans += orphans
    if terminate and orphans:
        try:
            done = await backend.terminate_nodes(bus.stage, orphans)
        except Exception as exc:
            log.warning("reconcile: terminating %s orphans failed: %s", key, exc)
            report.errors[key] = f"terminate: {type(exc).__name__}: {exc}"
            return False
        report.terminated += done
        for node in orphans:
            if node.instance_id in done:
                await record_orphan(bus, node, key, "terminated")
    return True


@dataclass(frozen=True)
class _Account:
    key: str  # "aws" (the server's default credentials) or "aws@PROFILE" (backends.credentials_key)
    profile: str | None
    backend: Any
    regions: tuple[str, ...]


async def _reconcile_aws(bus: Bus, backends: Backends, report: ReconcileReport, live: dict[str, ClusterProvisioned],
                         seqs: dict[str, int], *, launching: Collection[str], busy: Collection[str], terminate: bool,
                         now: datetime, grace_s: float) -> None:
    """Every AWS account a node of ours may be in: the default and each profile a team has ever
    had, one listing per (account, region), AWS_LISTINGS at a time, each within
    AWS_LISTING_TIMEOUT_S. An account (or a region of one) that cannot be listed is an error of
    its own, and its clusters are not called vanished: unseen is not gone."""
    try:
        backends.get("aws")
        base = set(await backends.aws_regions())
    except UnsupportedInfra as exc:
        report.errors["aws"] = str(exc)
        return
    except Exception as exc:  # one cloud failing must not hide the others
        log.warning("reconcile: listing aws failed: %s", exc)
        report.errors["aws"] = f"{type(exc).__name__}: {exc}"
        return
    histories = await teamcreds.load_all(bus)
    account_of = {c: teamcreds.launched_in(histories, ev.team, seqs.get(c, 0))
                  for c, ev in live.items() if ev.candidate.infra == "aws"}
    accounts: list[_Account] = []
    for profile in [None, *teamcreds.profiles_ever(histories.values())]:
        key = credentials_key("aws", aws_account(profile))
        try:
            backend = backends.get("aws", aws_account(profile),
                                   team=", ".join(teamcreds.teams_with(histories, profile or "")))
        except Exception as exc:  # a profile gone from the server (CredentialsNotFound): unknown, not gone
            kept = sorted(c for c, a in account_of.items() if a == profile)
            why = f"{exc}; not listed, so its clusters are kept ({', '.join(kept) or 'none live'})"
            log.warning("reconcile: %s", why)
            report.errors[key] = why
            continue
        regions = base | {live[c].candidate.region for c, a in account_of.items()
                          if a == profile and live[c].candidate.region}
        accounts.append(_Account(key, profile, backend, tuple(sorted(regions))))
    gate = asyncio.Semaphore(AWS_LISTINGS)

    async def listing(account: _Account, region: str) -> tuple[list[NodeInfo], str | None]:
        async with gate:
            try:
                return list(await asyncio.wait_for(account.backend.list_owned(bus.stage, [region]),
                                                   AWS_LISTING_TIMEOUT_S)), None
            except asyncio.TimeoutError:
                return [], f"no answer within {AWS_LISTING_TIMEOUT_S:.0f} s"
            except Exception as exc:
                return [], f"{type(exc).__name__}: {exc}"

    pairs = [(a, r) for a in accounts for r in a.regions]
    results = await asyncio.gather(*(listing(a, r) for a, r in pairs))
    known_by_account = {a.key: {n.instance_id for c, ev in live.items() if account_of.get(c) == a.profile
                                for n in ev.nodes} for a in accounts}
    every_known = {n.instance_id for ev in live.values() for n in ev.nodes}
    expected_all = expected_nodes(live, "aws", launching)
    for account in accounts:
        owned: list[NodeInfo] = []
        unlisted: set[str] = set()
        for (a, region), (nodes, why) in zip(pairs, results):
            if a is not account:
                continue
            owned += nodes
            if why is not None:
                unlisted.add(region)
                log.warning("reconcile: listing %s/%s failed: %s", account.key, region, why)
                report.errors[f"{account.key}/{region}"] = why
        report.checked[account.key] = [r for r in account.regions if r not in unlisted]
        # Launches in flight may be in any account: any node of theirs is accepted everywhere.
        expected = {c: ids for c, ids in expected_all.items() if c in launching or account_of.get(c) == account.profile}
        await _settle(bus, account.backend, account.key, report, owned, expected, live=live, unlisted=unlisted,
                      busy=busy, terminate=terminate, now=now, grace_s=grace_s,
                      known=every_known - known_by_account[account.key])


async def _reconcile_objects(bus: Bus, backend: ObjectOwner, infra: str, report: ReconcileReport, *,
                             regions: Sequence[str] | None, owned: Sequence[NodeInfo],
                             live: dict[str, ClusterProvisioned], unlisted: Collection[str], busy: Collection[str],
                             terminate: bool, now: datetime, grace_s: float) -> None:
    """The non-node objects' orphans of one backend: listed, decided (orphan_objects), recorded,
    deleted with `terminate`. A failure here is an error of its own, never the pass's."""
    try:
        listing = await backend.list_owned_objects(bus.stage, regions)
    except Exception as exc:
        log.warning("reconcile: listing %s objects failed: %s", infra, exc)
        report.errors[f"{infra}/objects"] = f"{type(exc).__name__}: {exc}"
        return
    for region, why in sorted(listing.unreachable.items()):
        report.errors.setdefault(f"{infra}/{region}", why)
    found = orphan_objects(listing.objects, stage=bus.stage, live=set(live), busy=busy,
                           with_nodes={(n.region or "", n.cluster or "") for n in owned},
                           unlisted=set(unlisted) | set(listing.unreachable), now=now, grace_s=grace_s)
    for obj in found:
        await record_object_orphan(bus, obj, infra, "reported")
    report.orphan_objects += found
    if not (terminate and found):
        return
    try:
        done = await backend.delete_objects(bus.stage, found)
    except Exception as exc:
        log.warning("reconcile: deleting %s orphan objects failed: %s", infra, exc)
        report.errors[f"{infra}/objects"] = f"delete: {type(exc).__name__}: {exc}"
        return
    for obj in found:
        if obj.name in done:
            report.terminated.append(object_id(obj))
            await record_object_orphan(bus, obj, infra, "terminated")


async def _sweep(bus: Bus, backends: Backends, report: ReconcileReport, policy: cleanup.RetryPolicy,
                 now: datetime) -> None:
    """Release unused resources in every region the stage touched and every region listed (where
    any orphan just terminated was)."""
    regions = await cleanup.TouchedRegions().update(bus)
    for infra, checked in report.checked.items():
        regions.setdefault(infra, set()).update(checked)
    regions = cleanup.with_accounts(regions, [k for k in report.checked if k.startswith("aws@")])
    try:
        swept = await cleanup.sweep(bus, backends, regions, policy, now=now)
    except Exception as exc:
        log.warning("reconcile: cleanup sweep failed: %s", exc)
        report.errors["cleanup"] = f"{type(exc).__name__}: {exc}"
        return
    report.cleanup_failed += [f"{f.resource_type} {f.resource} in {f.region}"
                              + (f" ({f.infra})" if f.infra != "aws" else "") + f": {f.code}" for f in swept.failed]
    for account, why in swept.errors.items():
        report.errors.setdefault(f"cleanup/{account}", why)


async def end_vanished(bus: Bus, provisioned: ClusterProvisioned, gone: Sequence[str], now: datetime) -> None:
    """ClusterTerminated for a cluster whose nodes are all gone (once per launch of the cluster)."""
    event = ClusterTerminated(cluster=provisioned.cluster, terminated_at=now, reason="vanished",
                              instance_ids=sorted(gone))
    await bus.publish(bus.envelope(event, id=derive_id(provisioned.placement_id, "reconcile", "vanished")))
    log.warning("reconcile: every node of cluster %s is gone: ClusterTerminated (vanished)", provisioned.cluster)


async def record_orphan(bus: Bus, node: NodeInfo, infra: str, action: str) -> bool:
    """Publish OrphanFound once per (node, action). Returns whether it was new."""
    cluster = node.cluster or UNKNOWN_CLUSTER
    subject = naming.event_subject(bus.stage, "cluster", cluster, OrphanFound.EVENT_NAME)
    seen = await find_event(bus, subject, lambda s: isinstance(s.event, OrphanFound)
                            and s.event.instance_id == node.instance_id and s.event.action == action)
    if seen is not None:
        return False
    detail = (f"{infra} {node.instance_type or ''} {node.state} in {node.zone or node.region or infra}; "
              f"launched {node.launched_at.isoformat() if node.launched_at else 'at an unknown time'}"
              + (f"; launch token {node.launch_token}" if node.launch_token else ""))
    event = OrphanFound(cluster=cluster, instance_id=node.instance_id, region=node.region or infra,
                        action=action, detail=detail)  # type: ignore[arg-type]
    env = bus.envelope(event, id=derive_id(f"{bus.stage}/{infra}/{node.instance_id}", "reconcile", action))
    await bus.publish(env)
    log.warning("reconcile: orphan %s (cluster %s) %s", node.instance_id, cluster, action)
    return True


async def record_object_orphan(bus: Bus, obj: OwnedObject, infra: str, action: str) -> bool:
    """OrphanFound for an object (once per object, region and action). Returns whether it was new."""
    cluster = obj.cluster or UNKNOWN_CLUSTER
    oid = object_id(obj)
    subject = naming.event_subject(bus.stage, "cluster", cluster, OrphanFound.EVENT_NAME)
    seen = await find_event(bus, subject, lambda s: isinstance(s.event, OrphanFound) and s.event.instance_id == oid
                            and s.event.region == obj.region and s.event.action == action)
    if seen is not None:
        return False
    detail = (f"{infra} {obj.kind} {obj.name} in {obj.region}, its cluster without pods; created "
              f"{obj.created_at.isoformat() if obj.created_at else 'at an unknown time'}")
    event = OrphanFound(cluster=cluster, instance_id=oid, region=obj.region, action=action,  # type: ignore[arg-type]
                        detail=detail)
    await bus.publish(bus.envelope(event, id=derive_id(f"{bus.stage}/{infra}/{obj.region}/{oid}", "reconcile",
                                                       action)))
    log.warning("reconcile: orphan %s (cluster %s, %s) %s", oid, cluster, obj.region, action)
    return True


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
