"""Resources -> ResourceRequests: the flat, normalised alternatives the optimizer ranks.

As SkyPilot's `Resources.from_yaml_config`: `any_of`/`ordered` entries are merged over the
other keys (labels merged, everything else replaced); a set or mapping of accelerators is an
unordered choice, a list an order of preference; `ordered` entries are tried in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .accelerators import canonical_name
from .request import ResourceRequest
from .values import (accelerator_choices, normalize_ports, parse_accelerator, parse_cpus, parse_disk_size, parse_infra,
                     parse_memory)

if TYPE_CHECKING:  # the models import pydantic; the plain dry run (plaintask.py) expands without them
    from .resources import Resources

# Keys interpreted into ResourceRequest fields; everything else set goes to `extra`.
_INTERPRETED = {
    "infra", "cloud", "region", "zone", "accelerators", "gpus", "cpus", "memory", "instance_type", "use_spot",
    "disk_size", "ephemeral_storage", "disk_tier", "network_tier", "image_id", "max_hourly_cost", "ports", "labels",
}


def _fields(model: Any) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json", exclude_unset=True)
    if "gpus" in data:  # the alias means the same key; an entry's gpus replaces the base accelerators
        data["accelerators"] = data.pop("gpus")
    data.pop("any_of", None)
    data.pop("ordered", None)
    return data


def _merge(base: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    merged.update(entry)
    if "labels" in base and "labels" in entry:
        merged["labels"] = {**base["labels"], **entry["labels"]}
    return merged


def resource_requests(resources: Resources | None) -> list[ResourceRequest]:
    if resources is None:
        return [ResourceRequest()]
    base = _fields(resources)
    if resources.any_of:
        out: list[ResourceRequest] = []
        for entry in resources.any_of:
            out.extend(_expand(_merge(base, _fields(entry)), None))
        return _unique(out)
    if resources.ordered:
        return _unique([r for i, entry in enumerate(resources.ordered) for r in _expand(_merge(base, _fields(entry)), i)])
    return requests_of_fields(base)


def requests_of_fields(fields: Mapping[str, Any]) -> list[ResourceRequest]:
    """The requests of resources without `any_of`/`ordered`, given as the model dumps them in
    JSON mode (the keys that were set, `gpus` as `accelerators`)."""
    return _unique(_expand(dict(fields), None))


def _unique(requests: list[ResourceRequest]) -> list[ResourceRequest]:
    # A set of candidates that collapse to the same request (e.g. any_of entries that only differ in
    # a key that the request does not carry) is still one candidate, as in SkyPilot's set.
    seen: list[ResourceRequest] = []
    for r in requests:
        if r not in seen:
            seen.append(r)
    return seen


def _expand(fields: dict[str, Any], order: int | None) -> list[ResourceRequest]:
    accs = fields.get("accelerators")
    choices = accelerator_choices(accs)
    if not choices:
        return [_single(fields, None, order)]
    if len(choices) == 1:
        return [_single(fields, choices[0], order)]
    ranked = isinstance(accs, list)
    return [_single(fields, acc, i if ranked else order) for i, acc in enumerate(choices)]


def _single(fields: dict[str, Any], accelerator: str | None, order: int | None) -> ResourceRequest:
    if "infra" in fields:
        infra = parse_infra(fields["infra"])
        cloud, region, zone = infra.cloud, infra.region, infra.zone
    else:
        cloud = fields.get("cloud")
        cloud = cloud.lower() if cloud else None
        region, zone = fields.get("region"), fields.get("zone")
    acc_name: str | None = None
    acc_count: float | None = None
    if accelerator is not None:
        name, count = parse_accelerator(accelerator)
        acc_name, acc_count = canonical_name(name), count
    cpus = parse_cpus(fields["cpus"]) if "cpus" in fields else None
    memory = parse_memory(fields["memory"]) if "memory" in fields else None
    disk = fields.get("disk_size", fields.get("ephemeral_storage"))
    # A docker login carries a password: it stays with the task, never in a request (requests
    # end up in events).
    extra = {k: v for k, v in fields.items() if k not in _INTERPRETED and k != "docker_login_config"}
    image_id = fields.get("image_id")
    return ResourceRequest(
        cloud=cloud,
        region=region,
        zone=zone,
        accelerator=acc_name,
        accelerator_count=acc_count,
        cpus=cpus.value if cpus else None,
        cpus_plus=cpus.plus if cpus else False,
        memory_gib=memory.value if memory else None,
        memory_plus=memory.plus if memory else False,
        memory_ratio=memory.ratio if memory else None,
        instance_type=fields.get("instance_type"),
        use_spot=bool(fields.get("use_spot", False)),
        disk_size_gb=parse_disk_size(disk) if disk is not None else None,
        disk_tier=fields["disk_tier"].lower() if fields.get("disk_tier") else None,
        network_tier=fields["network_tier"].lower() if fields.get("network_tier") else None,
        image_id=dict(image_id) if isinstance(image_id, dict) else image_id,
        max_hourly_cost=float(fields["max_hourly_cost"]) if fields.get("max_hourly_cost") is not None else None,
        ports=normalize_ports(fields.get("ports")),
        labels=dict(fields.get("labels") or {}),
        order=order,
        extra=extra,
    )
