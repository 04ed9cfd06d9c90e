"""A fault-injecting AWS for tests: moto's own WSGI app behind a thin middleware, one process.

    python tests/support/fakeaws.py --port 0      # prints "FAKEAWS_PORT=<port>", serves forever

What the middleware adds to moto, all at the HTTP boundary:

- Accounts by access key: a 12-digit access key id *is* the account id (the middleware turns
  it into moto's `x-moto-account-id` header), so each test gets a clean AWS by picking a new
  key, with no reset and no test-only code in the adapter.
- Fault rules (`POST /_fault/rules`): a matching EC2 call (action, account, region, zone,
  instance type, market) gets AWS's real error XML and HTTP status, so botocore's own error
  parsing and retry logic run. `after` lets N matching calls through first, `count` limits
  how often the rule fires. With `"effect": "terminate"` the call succeeds and then the
  instance at launch index `index` dies at once with a state reason (what AWS does when it
  cannot start a node it accepted: Server.InsufficientInstanceCapacity).
- Spot interruption (`POST /_fault/preempt`): an instance becomes terminated with StateReason
  Server.SpotInstanceTermination, which moto cannot do from outside.
- Placement groups (Create/Describe/DeletePlacementGroup), which moto 5 does not implement.
- Capacity reservations (Create/DescribeCapacityReservations), which moto 5 does not implement
  either: a RunInstances that targets one (CapacityReservationSpecification) must match its
  type and zone and fit in what is left of it, as AWS checks, and takes from its count.
- A request log (`GET /_fault/requests?account=&action=`): tests count what reached "AWS".

Everything else is moto, started with instance-type, AMI and key-pair validation on.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import re
import sys
import threading
import uuid
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs
from xml.sax.saxutils import escape

# Validation must be on before moto reads its settings (at import time).
os.environ.setdefault("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "1")
os.environ.setdefault("MOTO_ENABLE_AMI_VALIDATION", "1")
os.environ.setdefault("MOTO_ENABLE_KEYPAIR_VALIDATION", "1")

DEFAULT_ACCOUNT = "123456789012"
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"

# HTTP status AWS sends with each error code (EC2 API reference: server errors are 5xx).
ERROR_STATUS: dict[str, int] = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    "InsufficientAddressCapacity": 500,
    "InsufficientVolumeCapacity": 500,
    "InternalError": 500,
    "InternalFailure": 500,
    "ServerInternal": 500,
    "RequestLimitExceeded": 503,
    "ServiceUnavailable": 503,
    "Unavailable": 503,
    "UnauthorizedOperation": 403,
    "AuthFailure": 401,
    "OptInRequired": 401,
    "Blocked": 403,
}

ERROR_MESSAGES: dict[str, str] = {
    "InsufficientInstanceCapacity": (
        "We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
        "requested ({zone}). Our system will be working on provisioning additional capacity. You can "
        "currently get {instance_type} capacity by not specifying an Availability Zone in your request "
        "or choosing a different Availability Zone."
    ),
    "InsufficientCapacity": "There is not enough capacity to fulfill your request.",
    "SpotMaxPriceTooLow": (
        "Your Spot request price of 0.01 is lower than the minimum required Spot request fulfillment "
        "price of 0.5."
    ),
    "VcpuLimitExceeded": (
        "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance "
        "bucket that the specified instance type belongs to. Please visit "
        "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."
    ),
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "InstanceLimitExceeded": "You have requested more instances than your current instance limit allows.",
    "Unsupported": (
        "Your requested instance type ({instance_type}) is not supported in your requested Availability "
        "Zone ({zone}). Please retry your request by not specifying an Availability Zone or choosing "
        "another one."
    ),
    "RequestLimitExceeded": "Request limit exceeded.",
    "UnauthorizedOperation": (
        "You are not authorized to perform this operation. User: arn:aws:iam::{account}:user/test is not "
        "authorized to perform: ec2:{action} because no identity-based policy allows the ec2:{action} "
        "action. Encoded authorization failure message: AbCdEf0123"
    ),
    "AuthFailure": "AWS was not able to validate the provided access credentials",
    "InternalError": "An internal error has occurred",
    "ServiceUnavailable": "The service is unavailable. Please try again shortly.",
    "Unavailable": "The server is overloaded and can't handle the request.",
}

PREEMPT_CODE = "Server.SpotInstanceTermination"
PREEMPT_MESSAGE = "Server.SpotInstanceTermination: Spot instance termination"
LAUNCH_FAILURE_CODE = "Server.InsufficientInstanceCapacity"
LAUNCH_FAILURE_MESSAGE = "Server.InsufficientInstanceCapacity: Insufficient capacity to satisfy instance request"

_ACCESS_KEY_RE = re.compile(r"Credential=([^/,\s]+)/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")


@dataclass
class Rule:
    id: str
    action: str = "RunInstances"
    account: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    market: str | None = None  # "spot" | "on-demand"
    code: str = "InsufficientInstanceCapacity"
    message: str | None = None
    status: int | None = None
    count: int | None = None  # how many more times it fires; None: every time
    after: int = 0  # matching calls to let through before firing
    effect: str = "error"  # "error" | "terminate" (launch succeeds, node `index` dies at once)
    index: int = 0
    fired: int = 0

    def matches(self, req: "Call") -> bool:
        if self.count is not None and self.count <= 0:
            return False
        return (
            self.action == req.action
            and (self.account is None or self.account == req.account)
            and (self.region is None or self.region == req.region)
            and (self.zone is None or self.zone == req.zone)
            and (self.instance_type is None or self.instance_type == req.params.get("InstanceType"))
            and (self.market is None or self.market == req.market)
        )


@dataclass
class Call:
    account: str
    region: str
    service: str
    action: str
    params: dict[str, str]
    zone: str | None = None
    market: str = "on-demand"
    status: int | None = None
    fault: str | None = None


@dataclass
class PlacementGroup:
    name: str
    group_id: str
    strategy: str
    tags: dict[str, str] = field(default_factory=dict)
    members: set[str] = field(default_factory=set)


@dataclass
class CapacityReservation:
    reservation_id: str
    instance_type: str
    zone: str
    total: int
    members: set[str] = field(default_factory=set)


class FaultMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.rules: list[Rule] = []
        self.calls: list[Call] = []
        self.placement_groups: dict[tuple[str, str], dict[str, PlacementGroup]] = {}
        self.reservations: dict[tuple[str, str], dict[str, CapacityReservation]] = {}
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ WSGI entry

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_fault/"):
            return self._control(environ, start_response, path[len("/_fault/"):])
        body = _read_body(environ)
        call = self._parse_call(environ, body)
        if call is None:
            return self.app(environ, start_response)
        with self.lock:
            self.calls.append(call)
            rule = self._fire(call, "error")
            after_rule = self._fire(call, "terminate") if rule is None else None
        if rule is not None:
            call.fault = rule.code
            code = rule.code
            status = rule.status or ERROR_STATUS.get(code, 400)
            call.status = status
            return _error(start_response, status, code, _message(rule, call))
        if call.service == "ec2" and call.action in _PG_ACTIONS:
            status, text = self._placement_group(call)
            call.status = status
            return _respond(start_response, status, text)
        if call.service == "ec2" and call.action in _CR_ACTIONS:
            status, text = self._capacity_reservation(call)
            call.status = status
            return _respond(start_response, status, text)
        target = call.params.get(_CR_TARGET) if call.action == "RunInstances" else None
        refused = self._reservation_refusal(call, target) if target else None
        if refused is not None:
            call.status, call.fault = 400 if refused[0] != "ReservationCapacityExceeded" else 500, refused[0]
            return _error(start_response, call.status, refused[0], refused[1])
        status_box: list[str] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status_box.append(status)
            return start_response(status, headers, exc_info) if exc_info else start_response(status, headers)

        result = self.app(environ, capture)
        if call.action != "RunInstances":
            call.status = int(status_box[0].split()[0]) if status_box else None
            return result
        # RunInstances: read the answer to learn the instance ids (launch order).
        chunks = list(result)
        if hasattr(result, "close"):
            result.close()
        call.status = int(status_box[0].split()[0]) if status_box else None
        payload = b"".join(chunks)
        if call.status == 200:
            ids = _instance_ids(payload)
            group = call.params.get("Placement.GroupName")
            if group:
                with self.lock:
                    pg = self.placement_groups.get((call.account, call.region), {}).get(group)
                    if pg is not None:
                        pg.members.update(ids)
            if target:
                with self.lock:
                    cr = self.reservations.get((call.account, call.region), {}).get(target)
                    if cr is not None:
                        cr.members.update(ids)
            if after_rule is not None and 0 <= after_rule.index < len(ids):
                code = after_rule.code if after_rule.code.startswith(("Server.", "Client.")) else LAUNCH_FAILURE_CODE
                _kill(call.account, call.region, ids[after_rule.index], code,
                      after_rule.message or (LAUNCH_FAILURE_MESSAGE if code == LAUNCH_FAILURE_CODE else code))
        return [payload]

    def _fire(self, call: Call, effect: str) -> Rule | None:
        for rule in self.rules:
            if rule.effect != effect or not rule.matches(call):
                continue
            if rule.after > 0:
                rule.after -= 1
                continue
            if rule.count is not None:
                rule.count -= 1
            rule.fired += 1
            return rule
        return None

    def _parse_call(self, environ: dict[str, Any], body: bytes) -> Call | None:
        auth = environ.get("HTTP_AUTHORIZATION", "")
        m = _ACCESS_KEY_RE.search(auth)
        if not m:
            return None
        access_key, region, service = m.groups()
        account = environ.get("HTTP_X_MOTO_ACCOUNT_ID")
        if not account:
            account = access_key if re.fullmatch(r"\d{12}", access_key) else DEFAULT_ACCOUNT
            environ["HTTP_X_MOTO_ACCOUNT_ID"] = account
        params: dict[str, str] = {}
        if body and "x-www-form-urlencoded" in environ.get("CONTENT_TYPE", ""):
            params = {k: v[0] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
        action = params.get("Action", environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2])
        market = "spot" if params.get("InstanceMarketOptions.MarketType") == "spot" else "on-demand"
        zone = params.get("Placement.AvailabilityZone")
        if zone is None and service == "ec2" and action == "RunInstances":
            zone = _zone_of_subnet(account, region, params.get("SubnetId") or params.get("NetworkInterface.1.SubnetId"))
        return Call(account=account, region=region, service=service, action=action, params=params,
                    zone=zone, market=market)

    # ------------------------------------------------------------------ placement groups

    def _placement_group(self, call: Call) -> tuple[int, str]:
        p = call.params
        with self.lock:
            groups = self.placement_groups.setdefault((call.account, call.region), {})
            if call.action == "CreatePlacementGroup":
                name = p.get("GroupName", "")
                if name in groups:
                    return 400, _error_xml("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
                tags = {p[k]: p.get(k[: -len("Key")] + "Value", "") for k in p
                        if re.fullmatch(r"TagSpecification\.\d+\.Tag\.\d+\.Key", k)}
                pg = PlacementGroup(name=name, group_id=f"pg-{uuid.uuid4().hex[:17]}",
                                    strategy=p.get("Strategy", "cluster"), tags=tags)
                groups[name] = pg
                return 200, _ec2_xml("CreatePlacementGroupResponse", f"<placementGroup>{_pg_xml(pg, call)}</placementGroup>")
            if call.action == "DeletePlacementGroup":
                name = p.get("GroupName", "")
                pg = groups.get(name)
                if pg is None:
                    return 400, _error_xml("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
                if any(_alive(call.account, call.region, i) for i in pg.members):
                    return 400, _error_xml("InvalidPlacementGroup.InUse", f"The placement group '{name}' is in use and cannot be deleted.")
                del groups[name]
                return 200, _ec2_xml("DeletePlacementGroupResponse", "<return>true</return>")
            names = [v for k, v in sorted(p.items()) if re.fullmatch(r"GroupName\.\d+", k)]
            for name in names:
                if name not in groups:
                    return 400, _error_xml("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            chosen = [g for n, g in groups.items() if (not names or n in names) and _pg_passes(g, p)]
            items = "".join(f"<item>{_pg_xml(g, call)}</item>" for g in chosen)
            return 200, _ec2_xml("DescribePlacementGroupsResponse", f"<placementGroupSet>{items}</placementGroupSet>")

    # ------------------------------------------------------------------ capacity reservations

    def _capacity_reservation(self, call: Call) -> tuple[int, str]:
        p = call.params
        with self.lock:
            mine = self.reservations.setdefault((call.account, call.region), {})
            if call.action == "CreateCapacityReservation":
                try:
                    total = int(p.get("InstanceCount", "0"))
                except ValueError:
                    total = 0
                if total < 1 or not p.get("InstanceType") or not p.get("AvailabilityZone"):
                    return 400, _error_xml("InvalidParameterValue", "InstanceType, AvailabilityZone and a positive "
                                           "InstanceCount are required")
                cr = CapacityReservation(f"cr-{uuid.uuid4().hex[:17]}", p["InstanceType"], p["AvailabilityZone"], total)
                mine[cr.reservation_id] = cr
                return 200, _ec2_xml("CreateCapacityReservationResponse",
                                     f"<capacityReservation>{_cr_xml(cr, call)}</capacityReservation>")
            ids = [v for k, v in sorted(p.items()) if re.fullmatch(r"CapacityReservationId\.\d+", k)]
            for cid in ids:
                if cid not in mine:
                    return 400, _error_xml("InvalidCapacityReservationId.NotFound",
                                           f"The capacity reservation ID '{cid}' does not exist")
            items = "".join(f"<item>{_cr_xml(cr, call)}</item>" for cid, cr in mine.items() if not ids or cid in ids)
            return 200, _ec2_xml("DescribeCapacityReservationsResponse",
                                 f"<capacityReservationSet>{items}</capacityReservationSet>")

    def _reservation_refusal(self, call: Call, target: str) -> tuple[str, str] | None:
        """AWS's answer to a RunInstances into a reservation it cannot take (None: it can)."""
        with self.lock:
            cr = self.reservations.get((call.account, call.region), {}).get(target)
            if cr is None:
                return "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{target}' does not exist"
            if call.params.get("InstanceType") != cr.instance_type or call.zone not in (None, cr.zone):
                return "InvalidParameterValue", (f"The instance type or Availability Zone does not match capacity "
                                                 f"reservation {target} ({cr.instance_type} in {cr.zone})")
            wanted = int(call.params.get("MinCount", "1") or 1)
            left = cr.total - sum(1 for i in cr.members if _alive(call.account, call.region, i))
            if wanted > left:
                return "ReservationCapacityExceeded", (f"There is not enough capacity in capacity reservation "
                                                       f"{target}: {left} of {cr.total} available")
        return None

    # ------------------------------------------------------------------ control API

    def _control(self, environ: dict[str, Any], start_response: Callable[..., Any], what: str) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        raw = _read_body(environ)
        data = json.loads(raw) if raw else {}
        try:
            if what == "rules" and method == "POST":
                rule = Rule(id=str(next(self._ids)), **data)
                with self.lock:
                    self.rules.append(rule)
                return _json(start_response, 200, asdict(rule))
            if what == "rules" and method == "GET":
                with self.lock:
                    rules = [asdict(r) for r in self.rules if _same_account(r.account, query)]
                return _json(start_response, 200, {"rules": rules})
            if what == "rules" and method == "DELETE":
                with self.lock:
                    self.rules = [r for r in self.rules if not _same_account(r.account, query)]
                return _json(start_response, 200, {"ok": True})
            if what == "requests" and method == "GET":
                with self.lock:
                    calls = [asdict(c) for c in self.calls
                             if _same_account(c.account, query)
                             and query.get("action") in (None, c.action)
                             and query.get("region") in (None, c.region)]
                return _json(start_response, 200, {"count": len(calls), "requests": calls})
            if what == "requests" and method == "DELETE":
                with self.lock:
                    self.calls = [c for c in self.calls if not _same_account(c.account, query)]
                return _json(start_response, 200, {"ok": True})
            if what == "preempt" and method == "POST":
                state = _kill(data.get("account", DEFAULT_ACCOUNT), data["region"], data["instance_id"],
                              data.get("code", PREEMPT_CODE), data.get("message", PREEMPT_MESSAGE))
                return _json(start_response, 200, {"instance_id": data["instance_id"], "state": state})
            if what == "health":
                return _json(start_response, 200, {"ok": True})
        except (TypeError, KeyError, ValueError) as exc:
            return _json(start_response, 400, {"error": repr(exc)})
        return _json(start_response, 404, {"error": f"no such control endpoint: {method} {what}"})


def _pg_passes(pg: PlacementGroup, params: dict[str, str]) -> bool:
    """DescribePlacementGroups filters: group-name, strategy, state, tag:<key>, tag-key."""
    for key, fname in params.items():
        m = re.fullmatch(r"Filter\.(\d+)\.Name", key)
        if not m:
            continue
        values = {v for k, v in params.items() if k.startswith(f"Filter.{m.group(1)}.Value.")}
        if fname == "group-name":
            actual = {pg.name}
        elif fname == "strategy":
            actual = {pg.strategy}
        elif fname == "state":
            actual = {"available"}
        elif fname.startswith("tag:"):
            actual = {pg.tags[fname[4:]]} if fname[4:] in pg.tags else set()
        elif fname == "tag-key":
            actual = set(pg.tags)
        else:
            raise ValueError(f"filter {fname} not supported by fakeaws")
        if not actual & values:
            return False
    return True


_PG_ACTIONS = frozenset({"CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup"})
_CR_ACTIONS = frozenset({"CreateCapacityReservation", "DescribeCapacityReservations"})
_CR_TARGET = "CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId"


def _same_account(account: str | None, query: dict[str, str]) -> bool:
    return "account" not in query or account == query["account"]


def _read_body(environ: dict[str, Any]) -> bytes:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _message(rule: Rule, call: Call) -> str:
    template = rule.message or ERROR_MESSAGES.get(rule.code, f"{rule.code} (injected)")
    return template.format(
        instance_type=call.params.get("InstanceType", "m5.large"),
        zone=call.zone or f"{call.region}a",
        account=call.account,
        action=call.action,
    ) if rule.message is None else template


def _error_xml(code: str, message: str) -> str:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )


def _ec2_xml(root: str, inner: str) -> str:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{EC2_NS}">'
        f"<requestId>{uuid.uuid4()}</requestId>{inner}</{root}>"
    )


def _cr_xml(cr: CapacityReservation, call: Call) -> str:
    used = sum(1 for i in cr.members if _alive(call.account, call.region, i))
    return (
        f"<capacityReservationId>{cr.reservation_id}</capacityReservationId><ownerId>{call.account}</ownerId>"
        f"<instanceType>{escape(cr.instance_type)}</instanceType><availabilityZone>{escape(cr.zone)}</availabilityZone>"
        f"<totalInstanceCount>{cr.total}</totalInstanceCount><availableInstanceCount>{cr.total - used}"
        "</availableInstanceCount><state>active</state><instancePlatform>Linux/UNIX</instancePlatform>"
        "<instanceMatchCriteria>targeted</instanceMatchCriteria><tenancy>default</tenancy>"
    )


def _pg_xml(pg: PlacementGroup, call: Call) -> str:
    tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in pg.tags.items())
    return (
        f"<groupName>{escape(pg.name)}</groupName><state>available</state><strategy>{pg.strategy}</strategy>"
        f"<groupId>{pg.group_id}</groupId>"
        f"<groupArn>arn:aws:ec2:{call.region}:{call.account}:placement-group/{escape(pg.name)}</groupArn>"
        f"<tagSet>{tags}</tagSet>"
    )


def _error(start_response: Callable[..., Any], status: int, code: str, message: str) -> list[bytes]:
    return _respond(start_response, status, _error_xml(code, message))


def _respond(start_response: Callable[..., Any], status: int, text: str) -> list[bytes]:
    body = text.encode()
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
              500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Error")
    start_response(f"{status} {reason}", [("Content-Type", "text/xml;charset=UTF-8"),
                                           ("Content-Length", str(len(body)))])
    return [body]


def _json(start_response: Callable[..., Any], status: int, data: Any) -> list[bytes]:
    body = json.dumps(data).encode()
    start_response(f"{status} {'OK' if status == 200 else 'Error'}",
                   [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def _instance_ids(payload: bytes) -> list[str]:
    try:
        root = ET.fromstring(payload)
    except ET.ParseError:
        return []
    items: list[tuple[int, str]] = []
    for item in root.iter():
        if item.tag.endswith("item"):
            iid = item.find("{*}instanceId")
            if iid is not None and iid.text:
                idx = item.find("{*}amiLaunchIndex")
                items.append((int(idx.text) if idx is not None and idx.text else len(items), iid.text))
    return [i for _, i in sorted(items)]


def _backend(account: str, region: str) -> Any:
    from moto.ec2.models import ec2_backends

    return ec2_backends[account][region]


def _zone_of_subnet(account: str, region: str, subnet_id: str | None) -> str | None:
    if not subnet_id:
        return None
    try:
        return _backend(account, region).get_subnet(subnet_id).availability_zone
    except Exception:  # an unknown subnet: moto will answer the call with its own error
        return None


def _alive(account: str, region: str, instance_id: str) -> bool:
    try:
        return _backend(account, region).get_instance(instance_id).state not in ("terminated",)
    except Exception:
        return False


def _kill(account: str, region: str, instance_id: str, code: str, message: str) -> str:
    """Terminate an instance as AWS does on its own: with a Server.* state reason."""
    from moto.ec2.models.instances import StateReason

    instance = _backend(account, region).get_instance(instance_id)
    instance.terminate()
    instance.state_reason = StateReason(message, code)
    instance._reason = f"Service initiated ({code})"
    return instance.state


def make_app() -> FaultMiddleware:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    return FaultMiddleware(DomainDispatcherApplication(create_backend_app))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    from werkzeug.serving import make_server

    server = make_server(args.host, args.port, make_app(), threaded=True)
    print(f"FAKEAWS_PORT={server.server_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    sys.exit(main())
