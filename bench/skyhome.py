"""A throwaway SkyPilot HOME in which SkyPilot's own optimizer runs offline.

The benchmark times ``sky.optimizer.Optimizer.optimize`` (SkyPilot 0.14.1,
installed in its own virtualenv) from a cold process. Out of the box that
cannot run here, for two reasons, and this module prepares a HOME directory
that removes both without touching the network:

1. No ``sky check``. The optimizer only considers clouds that ``sky check``
   recorded as enabled in SkyPilot's state database (``~/.sky/state.db``;
   ``sky/check.py: get_cached_enabled_clouds_or_refresh``). With nothing
   recorded it would run the credential checks and then raise
   ``NoCloudAccessError: Cloud access is not set up``. We instead write
   ``~/.sky/config.yaml`` with ``allowed_clouds: [aws]`` and record, through
   SkyPilot's own ``global_user_state.set_allowed_clouds`` and
   ``set_enabled_clouds``, that AWS is allowed and enabled for the compute
   capability in the active workspace. Because the recorded allowed clouds
   equal the configured ones and the enabled list is non-empty, the check is
   never re-run.

2. No catalog download. On first use SkyPilot fetches its catalogs from
   GitHub into ``~/.sky/catalogs/<schema version>/aws/``
   (``sky/catalog/common.py: read_catalog``). We write a ``vms.csv`` in
   SkyPilot's column format (plus an ``images.csv`` and an
   ``instance_quota_mapping.csv``, which ``sky/catalog/aws_catalog.py`` also
   reads). Hand-written catalogs have no ``.meta/*.md5`` file, which SkyPilot
   treats as "modified by the user" and therefore never re-downloads, however
   old the file is. With no AWS credentials the availability-zone mapping
   (``_fetch_and_apply_az_mapping``) falls back to the 'default' mapping,
   which leaves the catalog as it is; the returned environment makes boto
   fail fast instead of probing the EC2 instance-metadata endpoint, and puts
   a stub ``aws`` first on PATH so that SkyPilot's ``aws configure list``
   probe costs the same (a few ms) on every machine.

The catalog is spz's own (every instance type, region, zone and price of
services/optimizer/catalog/, ~3,000 rows), so both optimizers place over the
same offerings; SkyPilot's real AWS catalog is larger, so this is, if
anything, kind to it. The benchmark times the optimizer, not its answer.

This runs in our interpreter (it reads spz's catalog). SkyPilot itself is run once, as
``sky_python -c ...``, to record the enabled cloud in its state database.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Which catalog schema SkyPilot 0.14.1 reads (sky/skylet/constants.py
# CATALOG_SCHEMA_VERSION). The prepare step asks SkyPilot and uses its
# answer; this is only the fallback when no interpreter is given.
_DEFAULT_SCHEMA_VERSION = "v8"

_VMS_HEADER = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,"
    "Price,SpotPrice,Region,AvailabilityZone,Arch"
)

# SkyPilot's catalog rows are spz's own catalog (services/optimizer/catalog/, the same AWS facts
# `spz launch --dryrun` places over): both optimizers choose among the same instance types,
# regions, zones and prices. Zones are written as zone IDs (use1-az1), as SkyPilot's catalog has
# them before its account mapping, which offline is the 'default' one.


def catalog_rows() -> list[str]:
    """vms.csv rows (SkyPilot's columns) for every offering of spz's catalog."""
    from skypurza.services.optimizer.catalog import load_catalog

    catalog = load_catalog()
    rows = []
    for itype in sorted(catalog.types.values()):
        for offer in catalog.offerings(itype.name):
            od = "" if offer.ondemand_micros is None else f"{offer.ondemand_micros / 1e6:g}"
            for zone in offer.zones:
                spot = "" if zone.spot_micros is None else f"{zone.spot_micros / 1e6:g}"
                rows.append(f"{itype.name},{itype.accelerator or ''},{itype.accelerator_count or ''},"
                            f"{itype.vcpus:g},{itype.memory_gib:g},,{od},{spot},{offer.region},{zone.zone},"
                            f"{itype.arch}")
    return rows


_IMAGES_CSV = """Tag,Region,OS,OSVersion,ImageId,CreationDate
skypilot:custom-cpu-ubuntu-2204,us-east-1,ubuntu,22.04,ami-00000000000000001,20250101
skypilot:custom-cpu-ubuntu-2204,us-west-2,ubuntu,22.04,ami-00000000000000002,20250101
"""

_QUOTA_HEADER = "InstanceType,OnDemandInstanceCode,SpotInstanceCode"

# Runs inside SkyPilot's interpreter with HOME set to the prepared dir.
# Prints the catalog schema version so the catalog lands where SkyPilot reads.
_RECORD_SCRIPT = """
from sky import clouds, global_user_state, skypilot_config
from sky.clouds import cloud as sky_cloud
from sky.skylet import constants
ws = skypilot_config.get_active_workspace()
global_user_state.set_allowed_clouds(['aws'], ws)
global_user_state.set_enabled_clouds([str(clouds.AWS())],
                                     sky_cloud.CloudCapability.COMPUTE, ws)
print(constants.CATALOG_SCHEMA_VERSION)
"""


def sky_env(home: Path, stub_aws_cli: bool = True) -> dict[str, str]:
    """The environment variables the prepared HOME needs (HOME included).

    No AWS credentials, config or metadata lookups: boto must give up at
    once rather than wait on the network. (Leave AWS_PROFILE unset in the
    caller's environment; an empty one is an error path in boto.)
    """
    home = Path(home)
    missing = str(home / ".aws-none")
    env = {}
    if stub_aws_cli:
        env["PATH"] = str(home / "bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    return env | {
        "HOME": str(home),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": missing + "/credentials",
        "AWS_CONFIG_FILE": missing + "/config",
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SESSION_TOKEN": "",
        "AWS_DEFAULT_REGION": "us-east-1",
        # No usage reporting to SkyPilot's collector.
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
    }


def _vms_csv(rows: list[str]) -> str:
    return "\n".join([_VMS_HEADER, *rows]) + "\n"


def prepare_sky_home(home: Path, sky_python: str, stub_aws_cli: bool = True) -> dict[str, str]:
    """Prepare ``home`` as an offline SkyPilot HOME; return the env to run in.

    The returned mapping includes ``HOME`` and the AWS variables that keep
    boto off the network; merge it over ``os.environ`` when running SkyPilot.

    With ``stub_aws_cli`` (default) it also puts ``home/bin`` first on PATH,
    holding an ``aws`` that exits 255 at once. SkyPilot shells out to
    ``aws configure list`` when it looks up the AWS identity for the zone
    mapping (sky/clouds/aws.py ``_aws_configure_list``); whatever ``aws``
    happens to be on PATH (none, a pyenv shim, the venv's awscli) would
    otherwise add 0 to ~1 s of machine-dependent time. Exit 255 is what the
    real CLI returns without a usable profile; SkyPilot then asks boto (STS),
    which finds no credentials and raises at once, and the 'default' mapping
    is used.
    """
    home = Path(home)
    sky_dir = home / ".sky"
    sky_dir.mkdir(parents=True, exist_ok=True)
    (sky_dir / "config.yaml").write_text("allowed_clouds:\n  - aws\n", encoding="utf-8")
    if stub_aws_cli:
        bin_dir = home / "bin"
        bin_dir.mkdir(exist_ok=True)
        stub = bin_dir / "aws"
        stub.write_text("#!/bin/sh\n# stand-in for awscli: no profile, no credentials\nexit 255\n", encoding="utf-8")
        stub.chmod(0o755)

    env = sky_env(home, stub_aws_cli)
    proc = subprocess.run(
        [sky_python, "-c", _RECORD_SCRIPT],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"recording enabled clouds failed (rc={proc.returncode}):\n{proc.stderr[-2000:]}"
        )
    schema = (proc.stdout.strip().splitlines() or [_DEFAULT_SCHEMA_VERSION])[-1].strip()

    aws_dir = sky_dir / "catalogs" / schema / "aws"
    aws_dir.mkdir(parents=True, exist_ok=True)
    rows = catalog_rows()
    (aws_dir / "vms.csv").write_text(_vms_csv(rows), encoding="utf-8")
    (aws_dir / "images.csv").write_text(_IMAGES_CSV, encoding="utf-8")
    types = sorted({r.split(",", 1)[0] for r in rows})
    (aws_dir / "instance_quota_mapping.csv").write_text(
        "\n".join([_QUOTA_HEADER, *(f"{t},L-1216C47A,L-34B43A08" for t in types)]) + "\n", encoding="utf-8")
    return env


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        raise SystemExit("usage: python bench/skyhome.py HOME SKY_PYTHON  (prints the environment to run sky in)")
    for k, v in prepare_sky_home(Path(sys.argv[1]), sys.argv[2]).items():
        print(f"{k}={v}")
