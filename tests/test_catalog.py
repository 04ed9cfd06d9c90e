"""The shipped catalog: built from the public facts, loaded fast, names normalised; rendering; CLI."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from skypurza.services.optimizer import render
from skypurza.services.optimizer.catalog import codec, load_catalog, save_catalog, shipped_catalog
from skypurza.services.optimizer.catalog.build import build
from skypurza.services.optimizer.catalog.loader import SHIPPED_FILE, catalog_path
from skypurza.services.optimizer.catalog.model import dollars_to_micros, format_dollars
from skypurza.services.optimizer.catalog.names import gpu_catalog_name
from skypurza.services.optimizer.local import LocalResources, parse_meminfo, parse_nvidia_smi
from skypurza.services.optimizer.placement import place
from skypurza.events.taskspec.request import ResourceRequest as R

from skypurza.services.optimizer.catalog.build import FACTS_DIR as FACTS


def fact_rows() -> list[dict[str, str]]:
    with (FACTS / "aws_vms.csv").open(newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ the shipped file

def test_shipped_file_has_date_source_and_every_fact() -> None:
    raw = json.loads(SHIPPED_FILE.read_text())
    assert raw["format"] == "spz-catalog" and raw["built_at"].endswith("Z") and "aws_vms.csv" in raw["source"]
    cat = shipped_catalog()
    rows = fact_rows()
    assert len(cat.types) == len({r["InstanceType"] for r in rows}) == 64
    assert len(cat.regions) == 24
    zone_rows = sum(len(o.zones) for o in cat.all_offerings())
    assert zone_rows == len(rows) == 3016
    for r in rows:  # every fact is there, exactly, as integer micro-dollars
        off = next(o for o in cat.offerings(r["InstanceType"]) if o.region == r["Region"])
        z = next(z for z in off.zones if z.zone == r["AvailabilityZone"])
        assert off.ondemand_micros == (dollars_to_micros(r["Price"]) if r["Price"] else None)
        assert z.spot_micros == (dollars_to_micros(r["SpotPrice"]) if r["SpotPrice"] else None)
        t = cat.types[r["InstanceType"]]
        assert t.vcpus == float(r["vCPUs"]) and t.memory_gib == float(r["MemoryGiB"])
        assert t.accelerator == (r["AcceleratorName"] or None)


def test_shipped_file_is_what_the_build_script_makes(tmp_path: Path) -> None:
    shipped = json.loads(SHIPPED_FILE.read_text())
    out = tmp_path / "aws.json"
    build(FACTS / "aws_vms.csv", FACTS / "accelerators.csv", out, built_at=shipped["built_at"])
    assert json.loads(out.read_text()) == shipped


def test_catalog_facts() -> None:
    cat = shipped_catalog()
    p4d = cat.types["p4d.24xlarge"]
    assert (p4d.vcpus, p4d.memory_gib, p4d.accelerator, p4d.accelerator_count, p4d.gpu_memory_mib, p4d.arch) == (
        96.0, 1152.0, "A100", 8, 40960, "x86_64")
    assert cat.types["p4de.24xlarge"].accelerator == "A100-80GB"
    # p5e.48xlarge is not sold on demand: the price stays unknown, never invented.
    assert all(o.ondemand_micros is None for o in cat.offerings("p5e.48xlarge"))
    assert cat.zone_region("use1-az4") == "us-east-1"
    assert {"use1-atl2-az1", "usw2-lax1-az1", "usw2-lax1-az2"} <= cat.local_zones
    assert cat.images == {}  # default AMIs: the provisioner asks AWS
    assert cat.resolve_zone("use1-az4") == "use1-az4" and cat.resolve_zone("us-east-1a") is None


def test_money_is_integer_micros() -> None:
    assert dollars_to_micros("21.957642") == 21_957_642
    assert dollars_to_micros("0.0806") == 80_600
    assert dollars_to_micros(0.1) == 100_000
    assert dollars_to_micros("0.00000049") == 0 and dollars_to_micros("0.0000005") == 1
    assert format_dollars(21_957_642) == "$21.96" and format_dollars(80_600) == "$0.0806"
    cat = shipped_catalog()
    assert all(isinstance(o.ondemand_micros, (int, type(None))) for o in cat.all_offerings())


def test_codec_round_trip_and_atomic_save(tmp_path: Path) -> None:
    cat = shipped_catalog()
    again = codec.loads(codec.dumps(cat))
    assert again.types == cat.types
    assert {o for o in again.all_offerings()} == {o for o in cat.all_offerings()}
    p = save_catalog(cat.with_offerings({}, spot_refreshed_at={"us-east-1": "2026-01-01T00:00:00Z"}),
                     tmp_path / "c.json")
    assert load_catalog(p, use_cache=False).spot_refreshed_at == {"us-east-1": "2026-01-01T00:00:00Z"}
    assert not list(tmp_path.glob("*.tmp*"))
    with pytest.raises(codec.CatalogFormatError):
        codec.loads('{"format": "other"}')


def test_which_catalog_file_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SKYPURZA_CATALOG", raising=False)
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path / "home"))
    assert catalog_path() == SHIPPED_FILE
    user = save_catalog(shipped_catalog().with_offerings({}, source="refreshed"))
    assert user == tmp_path / "home" / "catalog" / "aws.json"
    assert catalog_path() == user and load_catalog().source == "refreshed"
    other = save_catalog(shipped_catalog().with_offerings({}, source="env"), tmp_path / "x.json")
    monkeypatch.setenv("SKYPURZA_CATALOG", str(other))
    assert load_catalog().source == "env"


def test_cold_process_import_and_load_is_fast_and_light() -> None:
    code = (
        "import time, sys; t = time.perf_counter()\n"
        "from skypurza.services.optimizer.catalog import load_catalog\n"
        "from skypurza.services.optimizer.placement import place\n"
        "from skypurza.events.taskspec.request import ResourceRequest\n"
        "c = load_catalog(); p = place([ResourceRequest(accelerator='A100', accelerator_count=8)], 1, c)\n"
        "dt = time.perf_counter() - t\n"
        "heavy = sorted(m for m in ('pandas', 'numpy', 'pydantic', 'boto3', 'botocore', 'rich', 'typer')"
        " if m in sys.modules)\n"
        "print(dt, ','.join(heavy), p.chosen.instance_type)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_CATALOG", "SKYPURZA_HOME")}
    env["SKYPURZA_HOME"] = "/nonexistent-spz-home"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    dt, heavy, chosen = out.split()[0], out.split()[1] if len(out.split()) == 3 else "", out.split()[-1]
    assert heavy == "", f"import + load pulled in {heavy}"
    assert chosen == "p4d.24xlarge"
    print(f"cold import + load + place: {float(dt) * 1000:.1f} ms")
    assert float(dt) < 0.25  # ~20-40 ms here; pandas alone would take longer than this bound


# ------------------------------------------------------------------------------ names

def test_accelerator_normalisation() -> None:
    cat = shipped_catalog()
    assert cat.canonical_accelerator("a100") == "A100"
    assert cat.canonical_accelerator(" a100-80gb ") == "A100-80GB"
    assert cat.canonical_accelerator("l40s") == "L40S"
    assert cat.canonical_accelerator("tpu-V4") == "tpu-v4"
    assert cat.canonical_accelerator("nope") is None and cat.normalize_accelerator("nope") == "nope"
    assert place([R(accelerator="h100", accelerator_count=8)], 1, cat).chosen.accelerators == {"H100": 8.0}


@pytest.mark.parametrize("raw,mem,expected", [
    ("NVIDIA H200", 143771, "H200"),
    ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100"),
    ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
    ("Tesla T4", 15360, "T4"),
    ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
    ("Tesla V100-SXM2-16GB", 16384, "V100"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100"),
    ("NVIDIA A10G", 23028, "A10G"),
    ("NVIDIA L40S", 46068, "L40S"),
    ("NVIDIA GeForce RTX 4090", 24564, "RTX4090"),
    ("A100", 81920, "A100-80GB"),  # AWS GpuInfo naming of p4de
    ("Some New GPU", 1000, "SomeNewGPU"),
])
def test_gpu_names_to_catalog_spelling(raw: str, mem: int | None, expected: str) -> None:
    cat = shipped_catalog()
    assert gpu_catalog_name(raw, mem, cat.accelerator_clouds) == expected


def test_local_resource_parsers() -> None:
    cat = shipped_catalog()
    smi = "NVIDIA H200, 143771 MiB\nNVIDIA H200, 143771 MiB\nTesla T4, 15360 MiB\n\n"
    assert parse_nvidia_smi(smi, cat.accelerator_clouds) == {"H200": 2, "T4": 1}
    assert parse_meminfo("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == 23.4
    with pytest.raises(ValueError):
        parse_meminfo("nothing")


def test_detect_local_resources_reads_this_machine() -> None:
    from skypurza.services.optimizer.local import detect_local_resources

    res = detect_local_resources(nvidia_smi="spz-no-such-binary")
    assert res.cpus >= 1 and res.memory_gib > 0 and res.gpus == {}


# ------------------------------------------------------------------------------ rendering

def test_gpus_list_summary_rows() -> None:
    cat = shipped_catalog()
    rows = {r["accelerator"]: r for r in render.gpus_list_rows(cat)}
    assert set(rows) == set(cat.accelerators())
    a10g = rows["A10G"]
    assert a10g["counts"] == [1, 4, 8] and "g5.xlarge" in a10g["instance_types"]
    cheapest = min(o.ondemand_micros for t in a10g["instance_types"] for o in cat.offerings(t) if o.ondemand_micros)
    assert a10g["hourly_price_micros"] == cheapest and a10g["cheapest_regions"]


def test_gpus_list_detail_rows_and_region_filter() -> None:
    cat = shipped_catalog()
    rows = render.gpus_list_rows(cat, "h100", 8)
    assert [r["instance_type"] for r in rows] == ["p5.48xlarge"]
    r = rows[0]
    best = min((o.ondemand_micros, o.region) for o in cat.offerings("p5.48xlarge") if o.ondemand_micros)
    assert (r["hourly_price_micros"], r["region"]) == best
    # Local Zones (use1-atl2-az1 is the cheapest p5 spot) need an opt-in: not shown as cheapest.
    assert r["hourly_spot_price_micros"] == min(z.spot_micros for o in cat.offerings("p5.48xlarge")
                                                for z in o.zones if z.spot_micros and z.zone not in cat.local_zones)
    assert r["spot_zone"] not in cat.local_zones
    per_region = render.gpus_list_rows(cat, "H100", 8, all_regions=True)
    assert len(per_region) == len(cat.offerings("p5.48xlarge"))
    east = render.gpus_list_rows(cat, "L4", region="eu-north-1")
    assert east and all(r["region"] == "eu-north-1" for r in east)
    assert render.parse_accelerator_arg("a100:8") == ("a100", 8.0)
    assert render.parse_accelerator_arg("H100") == ("H100", None)


def test_gpus_list_compares_spot_with_on_demand_of_the_same_type_and_region() -> None:
    """`spz gpus list H100` showed spot above on-demand: the summary took the cheapest on-demand
    price of one size and the cheapest spot of another, in other regions. Now every price of a
    row is one instance type's, and the saving is against the spot zone's own region."""
    cat = shipped_catalog()
    for row in render.gpus_list_rows(cat, show_all=True):
        t = row["priced_instance_type"]
        assert t in row["instance_types"]
        offers = cat.offerings(t)
        if row["hourly_price_micros"] is not None:
            assert row["hourly_price_micros"] == min(o.ondemand_micros for o in offers if o.ondemand_micros)
        if row["hourly_spot_price_micros"] is not None:
            assert row["hourly_spot_price_micros"] == min(
                z.spot_micros for o in offers for z in o.zones if z.spot_micros and z.zone not in cat.local_zones)
    for acc in cat.accelerators():
        for row in render.gpus_list_rows(cat, acc) + render.gpus_list_rows(cat, acc, all_regions=True):
            if row["spot_saving"] is None:
                continue
            od_there = next(o.ondemand_micros for o in cat.offerings(row["instance_type"])
                            if o.region == row["spot_region"])
            assert row["spot_region_hourly_price_micros"] == od_there
            assert 0 <= row["spot_saving"] <= 0.95  # spot never above on-demand where it is sold
    h100 = {r["instance_type"]: r for r in render.gpus_list_rows(cat, "H100")}["p5.4xlarge"]
    # The cheapest on-demand region sells no spot; ap-south-1's spot is its own on-demand price.
    assert (h100["region"], h100["spot_region"], h100["spot_saving"]) == ("us-east-1", "ap-south-1", 0.0)
    h200 = {r["instance_type"]: r for r in render.gpus_list_rows(cat, "H200")}["p5en.48xlarge"]
    assert (h200["spot_region"], h200["spot_region_hourly_price"], h200["spot_saving"]) == ("eu-south-2", 68.35968, 0.9)


def test_no_implausible_spot_price_in_the_catalog(tmp_path: Path) -> None:
    """p5en.48xlarge spot at $6.836 in eu-south-2 is AWS's floor there (10% of its $68.36), as
    71 fact rows are: plausible. A spot price above on-demand, or below 5% of it, for the same
    type and region is not: the build refuses such facts, naming the price."""
    from skypurza.services.optimizer.catalog.sanity import spot_anomalies

    assert spot_anomalies(shipped_catalog().all_offerings()) == []
    rows = fact_rows()
    header = list(rows[0])
    for spot, kind in (("0.3", "below 5%"), ("70.5", "above the on-demand")):
        bad = [dict(r) for r in rows]
        for r in bad:
            if (r["InstanceType"], r["AvailabilityZone"]) == ("p5en.48xlarge", "eus2-az2"):
                r["SpotPrice"] = spot
        vms = tmp_path / "vms.csv"
        with vms.open("w", newline="") as f:
            w = csv.DictWriter(f, header)
            w.writeheader()
            w.writerows(bad)
        with pytest.raises(ValueError, match=f"p5en.48xlarge in eu-south-2 \\(eus2-az2\\).*{kind}"):
            build(vms, FACTS / "accelerators.csv", tmp_path / "out.json")


def test_dryrun_json_shape() -> None:
    cat = shipped_catalog()
    plan = place([R(accelerator="A100", accelerator_count=8)], 2, cat)
    out = render.dryrun_json(plan, cat)
    chosen = out["chosen"]
    for key in ("infra", "region", "zone", "instance_type", "accelerators", "use_spot", "hourly_price",
                "total_hourly_price"):
        assert key in chosen
    assert chosen["zone"] is None and chosen["total_hourly_price"] == pytest.approx(2 * chosen["hourly_price"])
    assert out["candidates"][0] == chosen and len(out["candidates"]) == len(plan.candidates)
    assert json.loads(json.dumps(out)) == out
    rows = render.dryrun_rows(plan, limit=3)
    assert [r["chosen"] for r in rows] == [True, False, False]
    bad = render.dryrun_json(place([R(accelerator="H200", accelerator_count=16)], 1, cat))
    assert bad["chosen"] is None and not bad["feasible"] and "H200:8" in bad["reason"]


# ------------------------------------------------------------------------------ CLI

@pytest.fixture()
def app() -> typer.Typer:
    from skypurza.cli.cmd_catalog import register

    a = typer.Typer()

    @a.callback()
    def _root() -> None:
        pass

    register(a)
    return a


def test_cli_gpus_list_json(app: typer.Typer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    monkeypatch.delenv("SKYPURZA_CATALOG", raising=False)
    res = CliRunner().invoke(app, ["gpus", "list", "a100:8", "--infra", "aws/us-east-1", "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["region"] == "us-east-1" and data["rows"][0]["instance_type"] == "p4d.24xlarge"
    monkeypatch.setenv("COLUMNS", "160")  # the table's own width, whatever terminal (or none) runs the suite
    table = CliRunner().invoke(app, ["gpus", "list"])
    assert table.exit_code == 0 and "H100" in table.output and "ACCELERATOR" in table.output
    unknown = CliRunner().invoke(app, ["gpus", "list", "zz9"])
    assert unknown.exit_code == 1
    gcp = CliRunner().invoke(app, ["gpus", "list", "--infra", "gcp"])
    assert gcp.exit_code == 2 and "not supported yet" in gcp.output


def test_cli_check_without_credentials(app: typer.Typer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    res = CliRunner().invoke(app, ["check", "-o", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    by = {s["infra"]: s for s in data["infras"]}
    assert by["aws"]["enabled"] is False and "no AWS credentials" in by["aws"]["reason"]
    assert by["local"]["enabled"] is True and "CPUs" in by["local"]["detail"]
    assert by["gcp"]["enabled"] is False and "not supported yet" in by["gcp"]["reason"]
    assert data["default_for_tasks"] == ["local"]


def test_local_gpus_rows() -> None:
    rows = render.local_gpus_rows(LocalResources(8, 32.0, {"H200": 8}))
    assert rows == [{"accelerator": "H200", "count": 8, "instance_type": "local", "hourly_price_micros": 0,
                     "hourly_price": 0.0, "region": None}]
