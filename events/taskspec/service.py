"""`service:` (SkyServe) and `pool:` specs: parsed and carried as SkyPilot 0.14.1's schema has them."""

# No `from __future__ import annotations` in the model modules: pydantic would evaluate every
# field's annotation string with eval() when the class is made (~10 ms of a cold check-yaml, issue 21).

import json
import re
from typing import Annotated, Any, Union

from pydantic import Field, Tag, field_validator, model_validator

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

    @model_validator(mode="after")
    def _autoscaling(self) -> "ReplicaPolicy":
        # SkyServe's own rules for a replica policy (its service spec refuses these at `serve up`).
        lo, hi = self.min_replicas, self.max_replicas
        if hi is not None and hi < lo:
            raise spz_error(f"max_replicas ({hi}) must be at least min_replicas ({lo})", "max_replicas")
        if self.target_qps_per_replica is not None:
            if hi is None:
                raise spz_error("autoscaling on target_qps_per_replica needs max_replicas", "target_qps_per_replica")
        elif hi is not None and hi != lo:
            raise spz_error(f"min_replicas ({lo}) and max_replicas ({hi}) differ but target_qps_per_replica is not "
                            "set: set it to autoscale, or make them equal", "max_replicas")
        return self


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

    @field_validator("ports")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise spz_error(f"a port is 1 to 65535, found {v}")
        return v

    @field_validator("readiness_probe")
    @classmethod
    def _probe_path(cls, v: Any) -> Any:
        path = v if isinstance(v, str) else v.path
        if not path.startswith("/"):
            raise spz_error(f"the readiness probe's path must start with /, found {path!r}",
                            *(() if isinstance(v, str) else ("path",)))
        if not isinstance(v, str) and isinstance(v.post_data, str):
            try:
                json.loads(v.post_data)
            except ValueError:
                raise spz_error("post_data as a string must be JSON (or write it as a mapping)", "post_data") from None
        return v

    @model_validator(mode="after")
    def _one_replica_spec(self) -> "Service":
        if "replicas" in self.model_fields_set and "replica_policy" in self.model_fields_set:
            raise spz_error("give either `replicas` or `replica_policy`, not both", "replicas")
        return self
