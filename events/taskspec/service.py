"""`service:` (SkyServe) and `pool:` specs: parsed and carried as SkyPilot 0.14.1's schema has them."""

from __future__ import annotations

import re
from typing import Annotated, Any, Union

from pydantic import Field, Tag, field_validator

from ._base import NotNull, Strict, check_enum, choose, is_dict, is_number, is_str, spz_error, tag

Num = int | float
NonNeg = Annotated[int, Field(ge=0)]
NonNegNum = Annotated[Num, Field(ge=0)]
LOAD_BALANCING_POLICIES: tuple[str, ...] = ("round_robin", "least_load", "instance_aware_least_load")
_QPS_KEY = re.compile(r"^[A-Z0-9]+(?::[0-9]+)?$")


PostData = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[dict[str, Any], Tag(tag("dict"))]],
    choose("a string or a mapping", ("str", is_str), ("dict", is_dict)),
]


class ReadinessProbe(Strict):
    path: str
    initial_delay_seconds: Annotated[Num | None, NotNull] = None
    timeout_seconds: Annotated[Num | None, NotNull] = None
    endpoint_probe_interval_seconds: Annotated[Num | None, NotNull] = None
    consecutive_failure_threshold_timeout: Annotated[Num | None, NotNull] = None
    post_data: Annotated[PostData | None, NotNull] = None
    headers: Annotated[dict[str, str] | None, NotNull] = None


class LoadBalancer(Strict):
    stream_timeout_seconds: Annotated[Num | None, NotNull] = None


class ServicePool(Strict):
    workers: Annotated[NonNeg | None, NotNull] = None
    min_workers: Annotated[NonNeg | None, NotNull] = None
    queue_length_threshold: Annotated[Annotated[int, Field(ge=1)] | None, NotNull] = None
    max_workers: Annotated[NonNeg | None, NotNull] = None
    upscale_delay_seconds: Annotated[NonNegNum | None, NotNull] = None
    downscale_delay_seconds: Annotated[NonNegNum | None, NotNull] = None


QpsTarget = Annotated[
    Union[Annotated[NonNegNum, Tag(tag("num"))], Annotated[dict[str, NonNegNum], Tag(tag("dict"))]],
    choose("a number or a mapping {ACCELERATOR[:COUNT]: qps}", ("num", is_number), ("dict", is_dict)),
]


class ReplicaPolicy(Strict):
    min_replicas: NonNeg
    max_replicas: Annotated[NonNeg | None, NotNull] = None
    num_overprovision: Annotated[NonNeg | None, NotNull] = None
    target_qps_per_replica: Annotated[QpsTarget | None, NotNull] = None
    dynamic_ondemand_fallback: Annotated[bool | None, NotNull] = None
    base_ondemand_fallback_replicas: Annotated[NonNeg | None, NotNull] = None
    spot_placer: Annotated[str | None, NotNull] = None
    upscale_delay_seconds: Annotated[Num | None, NotNull] = None
    downscale_delay_seconds: Annotated[Num | None, NotNull] = None

    @field_validator("target_qps_per_replica")
    @classmethod
    def _qps(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if not _QPS_KEY.match(key):
                    raise spz_error(f"expected an accelerator key like A100 or A100:2, found {key!r}", key)
        return v

    @field_validator("spot_placer")
    @classmethod
    def _placer(cls, v: str) -> str:
        return check_enum(v, ("dynamic_fallback",), "spot_placer")


class Tls(Strict):
    keyfile: str
    certfile: str


Probe = Annotated[
    Union[Annotated[str, Tag(tag("str"))], Annotated[ReadinessProbe, Tag(tag("dict"))]],
    choose("a path like /health or a mapping with `path`", ("str", is_str), ("dict", is_dict)),
]


class Service(Strict):
    """SkyServe service spec (also used for `pool:`, the `sky jobs pool` spec)."""

    readiness_probe: Annotated[Probe | None, NotNull] = None
    load_balancer: Annotated[LoadBalancer | None, NotNull] = None
    pool: Annotated[ServicePool | None, NotNull] = None
    replica_policy: Annotated[ReplicaPolicy | None, NotNull] = None
    ports: Annotated[int | None, NotNull] = None
    replicas: Annotated[int | None, NotNull] = None
    workers: Annotated[int | None, NotNull] = None
    load_balancing_policy: Annotated[str | None, NotNull] = None
    tls: Annotated[Tls | None, NotNull] = None

    @field_validator("load_balancing_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        return check_enum(v, LOAD_BALANCING_POLICIES, "load_balancing_policy")
