"""The AWS backend: EC2 gangs with aioboto3, idempotent, all or nothing, nothing orphaned.

A gang is launched with ONE RunInstances call (MinCount = MaxCount = N). EC2 then either
starts all N or fails the call, which is the all-or-nothing we want, and AWS recommends a
single request for a cluster placement group (a later request is more likely to find no
capacity near the first nodes). A node that AWS accepts but cannot start dies on its own
(state reason Server.InsufficientInstanceCapacity); then, and when the wait for `running`
fails, the launched nodes are terminated and one classified error is raised.

Idempotency: every launch carries the launch token as EC2's ClientToken (AWS returns the
same instances for a repeated token) and as a tag. Before launching, the adapter looks the
tag up and adopts what it finds (moto ignores ClientToken; the tag is what tests prove). A
rolled-back launch keeps its failure in a tag, so a repeated attempt raises the same error
instead of launching again.

Ranks come from EC2's AmiLaunchIndex (0..N-1 within the reservation) and are then written
as tags with each node's Name.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aioboto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from botocore.parsers import ResponseParserError

from skypurza.events import naming

from . import aws_errors
from .adapter import (
    CleanupFailure,
    CleanupIncomplete,
    ClusterRef,
    Failure,
    FailureKind,
    FailureScope,
    FatalProvisionError,
    LaunchSpec,
    NodeInfo,
    ProvisionError,
    ReleaseReport,
    TransientProvisionError,
    provision_error,
)
from .aws_instances import (
    assign_ranks,
    by_id,
    death_failure,
    encode_failure,
    node_info,
    stored_failure,
    tag_value,
)
from .aws_params import aws_tags, port_permissions, run_instances_params, tag_filters
from .aws_retry import RetryOptions, client_config, install_retry_policy

log = logging.getLogger(__name__)

# (owner, name pattern) searched in order when a task gives no image: the newest match wins.
# The first is AWS's current Deep Learning Base AMI; the second, older naming is also what
# moto ships, so the lookup path itself is exercised in tests.
DEFAULT_IMAGE_PATTERNS: tuple[tuple[str, str], ...] = (
    ("amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"),
    ("amazon", "Deep Learning AMI Ubuntu*"),
)

_ALIVE = ["pending", "running", "stopping", "stopped"]
_NOT_TERMINATED = _ALIVE + ["shutting-down"]
_DEAD = ("shutting-down", "terminated")
_MAX_FILTER_VALUES = 200
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit)


@dataclass(frozen=True)
class _Where:
    """Where a call happens, for the errors it raises."""

    region: str
    zone: str | None = None
    instance_type: str | None = None
    use_spot: bool | None = None


class AwsAdapter:
    """The AWS implementation of `ComputeBackend` (see adapter.py)."""

    infra = "aws"

    def __init__(
        self,
        *,
        session: aioboto3.Session | None = None,
        endpoint_url: str | None = None,
        regions: Sequence[str] = (),
        retry: RetryOptions = RetryOptions(),
        poll_interval: float = 2.0,
        launch_timeout: float = 900.0,
        terminate_timeout: float = 900.0,
        default_images: Mapping[str, str] | None = None,
        image_patterns: Sequence[tuple[str, str]] = DEFAULT_IMAGE_PATTERNS,
        save_keys: bool = True,
        ssh_cidr: str = "0.0.0.0/0",
        max_concurrency: int = 16,
    ) -> None:
        self._session = session or aioboto3.Session()
        # None: botocore still honours AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_EC2 by itself.
        self._endpoint_url = endpoint_url
        self.regions = tuple(regions)
        self._retry = retry
        self._poll = poll_interval
        self._launch_timeout = launch_timeout
        self._terminate_timeout = terminate_timeout
        self._default_images = dict(default_images or {})
        self._image_patterns = tuple(image_patterns)
        self._save_keys = save_keys
        self._ssh_cidr = ssh_cidr
        self._sem = asyncio.Semaphore(max_concurrency)
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._client_lock = asyncio.Lock()
        # One lock per (stage, region): creating shared resources and deleting unused ones must
        # not interleave within this process (other processes are handled by retrying).
        self._locks: dict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._zones: dict[str, dict[str, str]] = {}
        self._images: dict[tuple[str, str], str] = {}  # (region, image id) -> root device name
        self._found_images: dict[str, str] = {}

    async def __aenter__(self) -> AwsAdapter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._clients.clear()
        await self._stack.aclose()

    # ================================================================== launch

    async def launch(self, spec: LaunchSpec) -> list[NodeInfo]:
        if spec.user_data is not None and len(spec.user_data.encode()) > USER_DATA_LIMIT:
            raise FatalProvisionError(Failure(
                FailureKind.INVALID, FailureScope.REQUEST, "UserDataTooLarge",
                f"user data is {len(spec.user_data.encode())} bytes; EC2 allows {USER_DATA_LIMIT}",
            ), infra=self.infra, region=spec.region)
        where = _Where(spec.region, spec.zone, spec.instance_type, spec.use_spot)
        zone = await self._zone_name(spec.region, spec.zone, where) if spec.zone else None
        where = _Where(spec.region, zone, spec.instance_type, spec.use_spot)

        existing = await self._find(spec.region, where, {naming.TAG_LAUNCH_TOKEN: spec.launch_token}, states=None)
        if existing:
            log.info("launch %s: adopting %d instance(s) of an earlier attempt", spec.launch_token, len(existing))
            return await self._adopt(spec, where, existing)

        image = await self._image_for(spec, where)
        root_device = await self._root_device(spec.region, image, where)
        for attempt in (1, 2):
            async with self._locks[(spec.stage, spec.region)]:
                sg = await self._ensure_security_group(spec, where)
                key = await self._ensure_key_pair(spec.stage, where)
                group = await self._ensure_placement_group(spec, where) if spec.placement_group else None
                subnet = await self._subnet(spec.region, zone, where) if zone else None
                params = run_instances_params(
                    spec, zone=zone, image_id=image, root_device=root_device, security_group_id=sg,
                    key_name=key, placement_group=group, subnet_id=subnet,
                )
                try:
                    reply = await self._call(where, "run_instances", **params)
                    break
                except ProvisionError as err:
                    # A shared resource deleted by another process between ensure and launch.
                    if attempt == 2 or err.code not in _RACED_CODES:
                        raise
                    log.warning("launch %s: %s, creating resources again", spec.launch_token, err.code)
        launched = sorted(reply["Instances"], key=lambda i: i.get("AmiLaunchIndex", 0))
        return await self._finish(spec, where, launched)

    async def _adopt(self, spec: LaunchSpec, where: _Where, found: list[dict[str, Any]]) -> list[NodeInfo]:
        stored = next((f for f in (stored_failure(i) for i in found) if f is not None), None)
        alive = [i for i in found if i["State"]["Name"] not in _DEAD]
        if stored is not None:
            if alive:
                await self._terminate_ids(where, [i["InstanceId"] for i in alive])
            raise provision_error(stored, **self._context(where))
        if len(alive) == spec.num_nodes and len(found) == spec.num_nodes:
            return await self._finish(spec, where, alive)
        dead = [i for i in found if i["State"]["Name"] in _DEAD]
        failure = death_failure(dead, spec.use_spot) or Failure(
            FailureKind.UNKNOWN, FailureScope.REQUEST, "PartialLaunch",
            f"{len(alive)} of {spec.num_nodes} nodes of launch {spec.launch_token} are alive",
        )
        await self._rollback(where, [i["InstanceId"] for i in alive], failure)
        raise provision_error(failure, **self._context(where))

    async def _finish(self, spec: LaunchSpec, where: _Where, instances: list[dict[str, Any]]) -> list[NodeInfo]:
        """Tag ranks and names, wait until every node runs; roll back if a node dies."""
        ranked = assign_ranks(instances)
        ids = [iid for iid, _ in ranked]
        try:
            await self._gather(
                self._call(where, "create_tags", Resources=[iid], Tags=aws_tags({
                    naming.TAG_NAME: naming.instance_name(spec.stage, spec.cluster, rank),
                    naming.TAG_RANK: str(rank),
                }))
                for iid, rank in ranked
                if tag_value(by_id(instances, iid), naming.TAG_RANK) != str(rank)
            )
            running = await self._wait_running(spec, where, ids)
        except ProvisionError as err:
            if err.failure.failover or err.failure.fatal:
                await self._rollback(where, ids, err.failure)
            # Transient: leave the nodes; the same launch token adopts them on the next try.
            raise
        rank_of = dict(ranked)
        nodes = [node_info(i, spec.region, rank=rank_of[i["InstanceId"]]) for i in running]
        return sorted(nodes, key=lambda n: n.rank or 0)

    async def _wait_running(self, spec: LaunchSpec, where: _Where, ids: list[str]) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self._launch_timeout
        while True:
            # Filtering by id (not InstanceIds=) tolerates EC2's eventual consistency right after
            # a launch, when a fresh id may still be unknown to DescribeInstances.
            current = await self._describe_ids(where, ids)
            dead = [i for i in current if i["State"]["Name"] in _DEAD + ("stopped", "stopping")]
            if dead:
                failure = death_failure(dead, spec.use_spot) or Failure(
                    FailureKind.UNKNOWN, FailureScope.ZONE, dead[0].get("StateReason", {}).get("Code", "NodeLost"),
                    f"node {dead[0]['InstanceId']} is {dead[0]['State']['Name']} before the gang was up",
                )
                raise provision_error(failure, **self._context(where))
            if len(current) == len(ids) and all(i["State"]["Name"] == "running" for i in current):
                return current
            if time.monotonic() > deadline:
                raise provision_error(Failure(
                    FailureKind.CAPACITY, FailureScope.ZONE, "LaunchTimeout",
                    f"{spec.num_nodes} node(s) did not reach running within {self._launch_timeout:.0f} s",
                ), **self._context(where))
            await asyncio.sleep(self._poll)

    async def _rollback(self, where: _Where, ids: list[str], failure: Failure) -> None:
        """Terminate a failed gang, recording why on its instances (the tag outlives them)."""
        if not ids:
            return
        log.warning("rolling back %d node(s) in %s: %s", len(ids), where.region, failure.code)
        try:
            await self._call(where, "create_tags", Resources=ids,
                             Tags=aws_tags({naming.TAG_LAUNCH_FAILURE: encode_failure(failure)}))
        except ProvisionError as err:
            log.warning("could not record the failure on %s: %s", ids, err)
        await self._terminate_ids(where, ids)

    # ================================================================== other operations

    async def describe(self, ref: ClusterRef) -> list[NodeInfo]:
        """The cluster's nodes in any state (terminated ones while AWS still shows them, which
        is how a spot interruption is seen), ordered by rank."""
        found = await self._cluster_instances(ref, states=None)
        region = self._region_of(ref)
        return sorted((node_info(i, region) for i in found), key=lambda n: (n.rank is None, n.rank or 0, n.instance_id))

    async def stop(self, ref: ClusterRef) -> list[NodeInfo]:
        where = _Where(self._region_of(ref))
        found = await self._cluster_instances(ref, states=_ALIVE)
        if any(i.get("InstanceLifecycle") == "spot" for i in found):
            raise FatalProvisionError(Failure(
                FailureKind.UNSUPPORTED, FailureScope.REQUEST, "SpotStopUnsupported",
                f"cluster {ref.cluster} runs on spot instances, which cannot be stopped", "use down instead",
            ), infra=self.infra, region=where.region)
        ids = [i["InstanceId"] for i in found if i["State"]["Name"] in ("pending", "running")]
        if ids:
            await self._call(where, "stop_instances", InstanceIds=ids)
        await self._wait_states(where, [i["InstanceId"] for i in found], {"stopped"}, self._terminate_timeout)
        return await self.describe(ref)

    async def start(self, ref: ClusterRef) -> list[NodeInfo]:
        region = self._region_of(ref)
        found = await self._cluster_instances(ref, states=_ALIVE)
        where = _Where(region, found[0]["Placement"]["AvailabilityZone"] if found else None,
                       found[0]["InstanceType"] if found else None, False)
        ids = [i["InstanceId"] for i in found if i["State"]["Name"] in ("stopped", "stopping")]
        if ids:
            await self._wait_states(where, ids, {"stopped"}, self._terminate_timeout)
            await self._call(where, "start_instances", InstanceIds=ids)
        await self._wait_states(where, [i["InstanceId"] for i in found], {"running"}, self._launch_timeout)
        return await self.describe(ref)

    async def terminate(self, ref: ClusterRef, *, release: bool = True) -> list[str]:
        region = self._region_of(ref)
        where = _Where(region)
        found = await self._cluster_instances(ref, states=_NOT_TERMINATED)
        ids = sorted(i["InstanceId"] for i in found)
        if ids:
            await self._terminate_ids(where, ids)
            await self._wait_states(where, ids, {"terminated"}, self._terminate_timeout)
        if release:
            report = await self.release_unused(ref.stage, [region])
            if report.failures:
                raise CleanupIncomplete(ids, report.failures, **self._context(where))
        return ids

    async def terminate_nodes(self, stage: str, nodes: Sequence[NodeInfo]) -> list[str]:
        """Terminate orphans. Releasing what they used is the caller's sweep (reconcile.py), which
        reports each resource it could not release."""
        by_region: dict[str, list[str]] = defaultdict(list)
        for node in nodes:
            if node.region is None:
                raise ValueError(f"node {node.instance_id} has no region")
            by_region[node.region].append(node.instance_id)
        done: list[str] = []
        for region, wanted in by_region.items():
            where = _Where(region)
            mine = [i["InstanceId"] for i in await self._describe_ids(where, wanted)
                    if tag_value(i, naming.TAG_STAGE) == stage and tag_value(i, naming.TAG_PROJECT) == naming.PROJECT
                    and i["State"]["Name"] != "terminated"]
            if mine:
                await self._terminate_ids(where, mine)
                await self._wait_states(where, mine, {"terminated"}, self._terminate_timeout)
                done += mine
        return sorted(done)

    async def list_owned(self, stage: str, regions: Sequence[str] | None = None) -> list[NodeInfo]:
        chosen = tuple(regions or self.regions)
        if not chosen:
            raise ValueError("list_owned needs regions (none given, none configured)")
        tags = naming.base_tags(stage)
        per_region = await asyncio.gather(*(self._find(r, _Where(r), tags, states=_NOT_TERMINATED) for r in chosen))
        nodes = [node_info(i, r) for r, found in zip(chosen, per_region) for i in found]
        return sorted(nodes, key=lambda n: (n.region or "", n.cluster or "", n.rank or 0, n.instance_id))

    async def release_unused(self, stage: str, regions: Iterable[str], *,
                             skip: Collection[str] = ()) -> ReleaseReport:
        """Delete this stage's security groups, key pair and placement groups in `regions` that no
        instance uses any more (the last cluster using them is gone). Only resources tagged with
        this stage (the key pair: its stage's name) are touched.

        Never raises for one resource: each failure goes into the report with AWS's error and the
        others are still tried. A listing the endpoint does not implement (a bare moto_server has
        no placement groups) means no such resource can exist there: nothing to release."""
        report = ReleaseReport()
        skipped = set(skip)
        for region in regions:
            where = _Where(region)
            async with self._locks[(stage, region)]:
                if "instances:*" in skipped:
                    continue  # listing the nodes keeps failing and was given up on (reported)
                try:
                    users = await self._find(region, where, naming.base_tags(stage), states=_NOT_TERMINATED)
                except Exception as exc:  # without the users nothing can be called unused
                    report.failures.append(CleanupFailure(region, "instances", "*", "", _failure_of(exc)))
                    continue
                used_groups = {g["GroupId"] for i in users for g in i.get("SecurityGroups", [])}
                used_keys = {i.get("KeyName") for i in users}
                clusters = {tag_value(i, naming.TAG_CLUSTER) for i in users}
                used_pgs = {i.get("Placement", {}).get("GroupName") for i in users}
                used_pgs |= {naming.placement_group(stage, c) for c in clusters if c}
                stage_filter = tag_filters(naming.base_tags(stage))
                for group in await self._listing(where, report, skipped, "security-group", "describe_security_groups",
                                                 "SecurityGroups", Filters=stage_filter):
                    if group["GroupId"] not in used_groups:
                        await self._release(where, report, skipped, "security-group", group["GroupName"],
                                            group["GroupId"], "delete_security_group", GroupId=group["GroupId"])
                key = naming.key_pair(stage)
                for found in await self._listing(where, report, skipped, "key-pair", "describe_key_pairs", "KeyPairs",
                                                 Filters=stage_filter):
                    if found.get("KeyName") == key and key not in used_keys:
                        if await self._release(where, report, skipped, "key-pair", key, str(found.get("KeyPairId", "")),
                                               "delete_key_pair", KeyName=key):
                            naming.ssh_key_file(stage, region).unlink(missing_ok=True)
                for pg in await self._listing(where, report, skipped, "placement-group", "describe_placement_groups",
                                              "PlacementGroups", Filters=stage_filter):
                    if pg["GroupName"] not in used_pgs:
                        await self._release(where, report, skipped, "placement-group", pg["GroupName"],
                                            str(pg.get("GroupId", "")), "delete_placement_group",
                                            GroupName=pg["GroupName"])
        return report

    async def _listing(self, where: _Where, report: ReleaseReport, skip: set[str], kind: str, method: str,
                       key: str, **params: Any) -> list[dict[str, Any]]:
        if f"{kind}:*" in skip:
            return []  # this listing keeps failing and was given up on (reported)
        try:
            return list((await self._call(where, method, **params)).get(key, []))
        except Exception as exc:
            failure = _failure_of(exc)
            if aws_errors.not_implemented(failure):
                log.info("%s in %s: not implemented by this endpoint, so there is nothing to release",
                         method, where.region)
            else:
                report.failures.append(CleanupFailure(where.region, kind, "*", "", failure))
            return []

    async def _release(self, where: _Where, report: ReleaseReport, skip: set[str], kind: str, name: str,
                       resource_id: str, method: str, **params: Any) -> bool:
        if (resource_id and resource_id in skip) or name in skip:
            return False  # given up on: reported already
        try:
            deleted = await self._delete(where, method, **params)
        except Exception as exc:
            report.failures.append(CleanupFailure(where.region, kind, name, resource_id, _failure_of(exc)))
            return False
        if deleted:
            report.deleted.append(name)
        return deleted

    # ================================================================== resources

    async def _ensure_security_group(self, spec: LaunchSpec, where: _Where) -> str:
        """The stage's shared group, or the cluster's own when it opens ports."""
        per_cluster = bool(spec.ports)
        name = naming.security_group(spec.stage, spec.cluster if per_cluster else None)
        vpc = await self._default_vpc(where)
        filters = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc]}]
        found = (await self._call(where, "describe_security_groups", Filters=filters))["SecurityGroups"]
        if found:
            group_id: str = found[0]["GroupId"]
            if per_cluster:
                await self._authorize(where, group_id, port_permissions(spec.ports), ignore_duplicates=True)
            return group_id
        tags = {**naming.base_tags(spec.stage), naming.TAG_NAME: name}
        if per_cluster:
            tags[naming.TAG_CLUSTER] = spec.cluster
        try:
            reply = await self._call(
                where, "create_security_group", GroupName=name, VpcId=vpc,
                Description=f"SkyPurza nodes, stage {spec.stage}" + (f", cluster {spec.cluster}" if per_cluster else ""),
                TagSpecifications=[{"ResourceType": "security-group", "Tags": aws_tags(tags)}],
            )
        except ProvisionError as err:
            if err.code != "InvalidGroup.Duplicate":
                raise
            found = (await self._call(where, "describe_security_groups", Filters=filters))["SecurityGroups"]
            return str(found[0]["GroupId"])
        group_id = reply["GroupId"]
        permissions = [
            {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": self._ssh_cidr}]},
            # Nodes of a gang talk to each other freely (NCCL, EFA needs all traffic to itself).
            {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]},
            *port_permissions(spec.ports),
        ]
        await self._authorize(where, group_id, permissions, ignore_duplicates=True)
        return group_id

    async def _authorize(self, where: _Where, group_id: str, permissions: list[dict[str, Any]],
                         ignore_duplicates: bool) -> None:
        for permission in permissions:  # one by one: a duplicate rule fails the whole call
            try:
                await self._call(where, "authorize_security_group_ingress", GroupId=group_id,
                                 IpPermissions=[permission])
            except ProvisionError as err:
                if not (ignore_duplicates and err.code == "InvalidPermission.Duplicate"):
                    raise

    async def _ensure_key_pair(self, stage: str, where: _Where) -> str:
        name = naming.key_pair(stage)
        try:
            await self._call(where, "describe_key_pairs", KeyNames=[name])
            return name
        except ProvisionError as err:
            if err.code != "InvalidKeyPair.NotFound":
                raise
        try:
            reply = await self._call(
                where, "create_key_pair", KeyName=name, KeyType="ed25519",
                TagSpecifications=[{"ResourceType": "key-pair", "Tags": aws_tags(naming.base_tags(stage))}],
            )
        except ProvisionError as err:
            if err.code != "InvalidKeyPair.Duplicate":
                raise
            return name
        if self._save_keys:
            _write_private_key(naming.ssh_key_file(stage, where.region), reply["KeyMaterial"])
        return name

    async def _ensure_placement_group(self, spec: LaunchSpec, where: _Where) -> str:
        name = naming.placement_group(spec.stage, spec.cluster)
        tags = {**naming.base_tags(spec.stage), naming.TAG_CLUSTER: spec.cluster, naming.TAG_NAME: name}
        try:
            await self._call(where, "create_placement_group", GroupName=name, Strategy="cluster",
                             TagSpecifications=[{"ResourceType": "placement-group", "Tags": aws_tags(tags)}])
        except ProvisionError as err:
            if err.code != "InvalidPlacementGroup.Duplicate":
                raise
        return name

    async def _default_vpc(self, where: _Where) -> str:
        vpcs = (await self._call(where, "describe_vpcs", Filters=[{"Name": "isDefault", "Values": ["true"]}]))["Vpcs"]
        if not vpcs:
            raise provision_error(aws_errors.classify("VPCIdNotSpecified", f"no default VPC in {where.region}"),
                                  **self._context(where))
        return str(vpcs[0]["VpcId"])

    async def _subnet(self, region: str, zone: str, where: _Where) -> str | None:
        subnets = (await self._call(where, "describe_subnets", Filters=[
            {"Name": "availability-zone", "Values": [zone]}, {"Name": "default-for-az", "Values": ["true"]},
        ]))["Subnets"]
        return str(subnets[0]["SubnetId"]) if subnets else None

    async def _zone_name(self, region: str, zone: str, where: _Where) -> str:
        """Zone name for a zone name or a zone id (ids are the same in every account, names are not)."""
        if region not in self._zones:
            reply = await self._call(where, "describe_availability_zones")
            mapping: dict[str, str] = {}
            for z in reply["AvailabilityZones"]:
                mapping[z["ZoneName"]] = z["ZoneName"]
                if z.get("ZoneId"):
                    mapping[z["ZoneId"]] = z["ZoneName"]
            self._zones[region] = mapping
        name = self._zones[region].get(zone)
        if name is None:
            raise provision_error(Failure(
                FailureKind.UNSUPPORTED, FailureScope.ZONE, "UnknownAvailabilityZone",
                f"{zone} is not an availability zone (name or id) of {region}",
            ), **self._context(where))
        return name

    async def _image_for(self, spec: LaunchSpec, where: _Where) -> str:
        image = spec.image_id
        if isinstance(image, Mapping):
            chosen = image.get(spec.region)
            if chosen is None:
                raise provision_error(Failure(
                    FailureKind.UNSUPPORTED, FailureScope.REGION, "NoImageForRegion",
                    f"image_id names no image for {spec.region}",
                ), **self._context(where))
            image = chosen
        if isinstance(image, str) and image.startswith("docker:"):
            image = None  # the container runs on the default machine image
        if isinstance(image, str) and not image.startswith("ami-"):
            raise FatalProvisionError(Failure(
                FailureKind.INVALID, FailureScope.REQUEST, "UnsupportedImageId",
                f"image_id {image!r} is not an AMI id", "give an ami-... id (or docker:<image>)",
            ), **self._context(where))
        if image:
            return image
        if spec.region in self._default_images:
            return self._default_images[spec.region]
        if spec.region not in self._found_images:
            self._found_images[spec.region] = await self._find_default_image(where)
        return self._found_images[spec.region]

    async def _find_default_image(self, where: _Where) -> str:
        for owner, pattern in self._image_patterns:
            images = (await self._call(where, "describe_images", Owners=[owner], Filters=[
                {"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]},
                {"Name": "architecture", "Values": ["x86_64"]},
            ]))["Images"]
            if images:
                newest = max(images, key=lambda i: (i.get("CreationDate", ""), i["ImageId"]))
                return str(newest["ImageId"])
        raise provision_error(Failure(
            FailureKind.UNSUPPORTED, FailureScope.REGION, "NoDefaultImage",
            f"no default image found in {where.region}", "give image_id for this region",
        ), **self._context(where))

    async def _root_device(self, region: str, image: str, where: _Where) -> str:
        if (region, image) not in self._images:
            images = (await self._call(where, "describe_images", ImageIds=[image]))["Images"]
            if not images:
                raise provision_error(aws_errors.classify("InvalidAMIID.NotFound", f"image {image} not found in {region}"),
                                      **self._context(where))
            self._images[(region, image)] = images[0].get("RootDeviceName") or "/dev/sda1"
        return self._images[(region, image)]

    # ================================================================== EC2 plumbing

    async def _client(self, region: str) -> Any:
        async with self._client_lock:
            client = self._clients.get(region)
            if client is None:
                kwargs: dict[str, Any] = {"region_name": region, "config": client_config(self._retry)}
                if self._endpoint_url:
                    kwargs["endpoint_url"] = self._endpoint_url
                client = await self._stack.enter_async_context(self._session.client("ec2", **kwargs))
                install_retry_policy(client, self._retry)
                self._clients[region] = client
            return client

    async def _call(self, where: _Where, method: str, **params: Any) -> dict[str, Any]:
        """One EC2 call (retried by the installed policy); failures come out classified."""
        client = await self._client(where.region)
        async with self._sem:
            try:
                result: dict[str, Any] = await getattr(client, method)(**params)
                return result
            except ClientError as exc:
                error = exc.response.get("Error", {})
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                failure = aws_errors.classify(
                    str(error.get("Code", "Unknown")), str(error.get("Message", "")),
                    http_status=status, use_spot=bool(where.use_spot),
                )
                raise provision_error(failure, **self._context(where)) from exc
            except NoCredentialsError as exc:  # no credentials at all: no other place fixes that
                raise provision_error(Failure(
                    FailureKind.AUTH, FailureScope.CLOUD, "NoCredentials",
                    f"{exc}: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or run `aws configure`",
                ), **self._context(where)) from exc
            except ResponseParserError as exc:
                # An answer that is not AWS's XML: from an emulator, its "not implemented" page.
                unparsed = aws_errors.classify_unparsed(str(exc), emulator=_is_emulator(client))
                if unparsed is not None:
                    unparsed = Failure(unparsed.kind, unparsed.scope, unparsed.code,
                                       f"{_action(method)}: {unparsed.message}", unparsed.hint)
                    raise provision_error(unparsed, **self._context(where)) from exc
                raise TransientProvisionError(Failure(
                    FailureKind.TRANSIENT, FailureScope.REQUEST, type(exc).__name__, str(exc)[:500],
                ), **self._context(where)) from exc
            except BotoCoreError as exc:  # connection failures, still failing after the retries
                raise TransientProvisionError(Failure(
                    FailureKind.TRANSIENT, FailureScope.REQUEST, type(exc).__name__, str(exc),
                ), **self._context(where)) from exc

    async def _delete(self, where: _Where, method: str, **params: Any) -> bool:
        try:
            await self._call(where, method, **params)
            return True
        except ProvisionError as err:
            if err.code.endswith(".NotFound") or err.code.endswith(".Unknown"):
                return False
            if err.code in ("DependencyViolation", "InvalidPlacementGroup.InUse", "InvalidGroup.InUse"):
                log.info("%s %s: still in use", method, params)
                return False
            raise

    async def _find(self, region: str, where: _Where, tags: Mapping[str, str],
                    states: Sequence[str] | None) -> list[dict[str, Any]]:
        filters = tag_filters(tags)
        if states is not None:
            filters.append({"Name": "instance-state-name", "Values": list(states)})
        return await self._describe(where, filters)

    async def _describe(self, where: _Where, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"Filters": filters, "MaxResults": 1000}
            if token:
                params["NextToken"] = token
            page = await self._call(where, "describe_instances", **params)
            out += [i for r in page.get("Reservations", []) for i in r.get("Instances", [])]
            token = page.get("NextToken")
            if not token:
                return out

    async def _describe_ids(self, where: _Where, ids: Sequence[str]) -> list[dict[str, Any]]:
        chunks = [list(ids[i:i + _MAX_FILTER_VALUES]) for i in range(0, len(ids), _MAX_FILTER_VALUES)]
        pages = await asyncio.gather(*(self._describe(where, [{"Name": "instance-id", "Values": c}]) for c in chunks))
        return [i for page in pages for i in page]

    async def _cluster_instances(self, ref: ClusterRef, states: Sequence[str] | None) -> list[dict[str, Any]]:
        region = self._region_of(ref)
        where = _Where(region)
        tags = {**naming.base_tags(ref.stage), naming.TAG_CLUSTER: ref.cluster}
        found = {i["InstanceId"]: i for i in await self._find(region, where, tags, states)}
        missing = [i for i in ref.instance_ids if i not in found]
        if missing:
            for inst in await self._describe_ids(where, missing):
                if states is None or inst["State"]["Name"] in states:
                    found[inst["InstanceId"]] = inst
        return list(found.values())

    async def _terminate_ids(self, where: _Where, ids: Sequence[str]) -> None:
        for i in range(0, len(ids), 1000):
            await self._call(where, "terminate_instances", InstanceIds=list(ids[i:i + 1000]))

    async def _wait_states(self, where: _Where, ids: Sequence[str], wanted: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while ids:
            current = await self._describe_ids(where, ids)
            if all(i["State"]["Name"] in wanted for i in current):
                return
            if "running" in wanted and any(i["State"]["Name"] in _DEAD for i in current):
                dead = [i for i in current if i["State"]["Name"] in _DEAD]
                failure = death_failure(dead, bool(where.use_spot)) or Failure(
                    FailureKind.UNKNOWN, FailureScope.ZONE, "NodeLost", f"{dead[0]['InstanceId']} terminated")
                raise provision_error(failure, **self._context(where))
            if time.monotonic() > deadline:
                raise TransientProvisionError(Failure(
                    FailureKind.TRANSIENT, FailureScope.REQUEST, "WaitTimeout",
                    f"{len(ids)} node(s) not {'/'.join(sorted(wanted))} after {timeout:.0f} s",
                ), **self._context(where))
            await asyncio.sleep(self._poll)

    async def _gather(self, calls: Iterable[Any]) -> None:
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _region_of(self, ref: ClusterRef) -> str:
        if ref.region:
            return ref.region
        if len(self.regions) == 1:
            return self.regions[0]
        raise ValueError(f"cluster {ref.cluster}: region unknown")

    def _context(self, where: _Where) -> dict[str, Any]:
        return {"infra": self.infra, "region": where.region, "zone": where.zone,
                "instance_type": where.instance_type, "use_spot": where.use_spot}


def _failure_of(exc: BaseException) -> Failure:
    """The classified failure of an exception raised while releasing (a bug included)."""
    if isinstance(exc, ProvisionError):
        return exc.failure
    return Failure(FailureKind.UNKNOWN, FailureScope.REQUEST, type(exc).__name__, str(exc)[:500])


def _is_emulator(client: Any) -> bool:
    """Whether the client talks to something other than AWS (AWS_ENDPOINT_URL, moto_server ...)."""
    url = str(getattr(getattr(client, "meta", None), "endpoint_url", "") or "")
    return not (url.endswith(".amazonaws.com") or url.endswith(".amazonaws.com.cn") or ".amazonaws.com/" in url
                or ".amazonaws.com.cn/" in url)


def _action(method: str) -> str:
    """EC2's action name for a client method (describe_placement_groups -> DescribePlacementGroups)."""
    return "".join(part.capitalize() for part in method.split("_"))


_RACED_CODES = frozenset({"InvalidGroup.NotFound", "InvalidKeyPair.NotFound", "InvalidPlacementGroup.Unknown"})


def _write_private_key(path: Path, material: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(material)
