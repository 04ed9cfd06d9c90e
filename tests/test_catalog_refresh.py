"""`catalog refresh` and the live spot refresh against a real moto server over HTTP.

EC2 calls go to the fake AWS process (moto behind a fault-injecting middleware,
tests/support/fakeaws.py). moto has no Pricing API, so on-demand prices come from a small
HTTP server speaking the Price List API's JSON protocol (a fake at the HTTP boundary only).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import pytest
import typer
from typer.testing import CliRunner

from aws_fixtures import SECRET, FakeAws
from skypurza.events.taskspec.request import ResourceRequest as R
from skypurza.services.optimizer.catalog import Catalog, load_catalog, shipped_catalog
from skypurza.services.optimizer.catalog.pricing import PricingApiSource, parse_price_list_item
from skypurza.services.optimizer.catalog.refresh import refresh_catalog, refresh_spot_prices
from skypurza.services.optimizer.placement import place

FAMILIES = ["p4d", "p4de", "g5", "m6i"]
MOTO_SPOT_MICROS = 10  # moto answers every spot price history entry with "0.00001"


def _item(region: str, itype: str, usd: str) -> str:
    return json.dumps({
        "product": {"productFamily": "Compute Instance",
                    "attributes": {"instanceType": itype, "regionCode": region, "operatingSystem": "Linux"}},
        "terms": {"OnDemand": {"SKU.TERM": {"priceDimensions": {
            "SKU.TERM.DIM": {"unit": "Hrs", "pricePerUnit": {"USD": usd}, "description": "On Demand Linux"}}}}},
    })


# What the fake Price List API knows: (region, type) -> USD/h as AWS writes it.
PRICES = {
    ("us-east-1", "p4d.24xlarge"): "32.7726000000",
    ("us-east-1", "m6i.large"): "0.0960000000",
    ("us-east-1", "m6i.8xlarge"): "1.5360000000",
    ("eu-north-1", "p4d.24xlarge"): "30.0000000000",
}


class _PricingHandler(BaseHTTPRequestHandler):
    calls: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 -- http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.headers["X-Amz-Target"] == "AWSPriceListService.GetProducts"
        type(self).calls.append(body)
        f = {x["Field"]: x["Value"] for x in body.get("Filters", [])}
        items = [_item(r, t, usd) for (r, t), usd in sorted(PRICES.items())
                 if r == f.get("regionCode") and t == f.get("instanceType", t)]
        # Two items per page, so pagination through NextToken is exercised.
        start = int(body.get("NextToken") or 0)
        page = {"FormatVersion": "aws_v1", "PriceList": items[start:start + 2]}
        if start + 2 < len(items):
            page["NextToken"] = str(start + 2)
        data = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def pricing_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PricingHandler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _session(aws: FakeAws) -> Any:
    return boto3.session.Session(aws_access_key_id=aws.account_id, aws_secret_access_key=SECRET,
                                 region_name="us-east-1")


def _moto_zones(aws: FakeAws, region: str, itype: str) -> set[str]:
    resp = aws.client(region).describe_instance_type_offerings(
        LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": [itype]}])
    return {o["Location"] for o in resp["InstanceTypeOfferings"]}


def _offering(cat: Catalog, itype: str, region: str) -> Any:
    return next(o for o in cat.offerings(itype) if o.region == region)


def test_price_list_item_parsing() -> None:
    assert parse_price_list_item(_item("us-east-1", "p4d.24xlarge", "32.7726000000")) == (
        "us-east-1", "p4d.24xlarge", 32_772_600)
    assert parse_price_list_item('{"product": {"attributes": {}}}') is None


def test_refresh_rebuilds_regions_from_ec2(fake_aws: FakeAws, pricing_url: str) -> None:
    base = shipped_catalog()
    seen: list[str] = []
    res = refresh_catalog(base, ["us-east-1", "eu-north-1"], families=FAMILIES, session=_session(fake_aws),
                          endpoint_url=fake_aws.endpoint_url, pricing_endpoint_url=pricing_url,
                          progress=seen.append)
    cat = res.catalog
    assert res.regions_refreshed == ["eu-north-1", "us-east-1"] and not res.regions_failed
    assert any("[2/2]" in s for s in seen)
    # Offerings per zone ID exactly as EC2 lists them.
    for region in ("us-east-1", "eu-north-1"):
        assert {z.zone for z in _offering(cat, "p4d.24xlarge", region).zones} == _moto_zones(
            fake_aws, region, "p4d.24xlarge")
    # Spot: the latest price per zone from describe_spot_price_history, keyed by zone ID.
    p4d = _offering(cat, "p4d.24xlarge", "us-east-1")
    assert {z.spot_micros for z in p4d.zones} == {MOTO_SPOT_MICROS}
    # On-demand: from the Price List API where it priced the type ...
    assert p4d.ondemand_micros == 32_772_600
    assert _offering(cat, "p4d.24xlarge", "eu-north-1").ondemand_micros == 30_000_000
    assert _offering(cat, "m6i.8xlarge", "us-east-1").ondemand_micros == 1_536_000  # a type new to us
    # ... and the previous catalog's price where it did not, said in the notes.
    assert _offering(cat, "g5.xlarge", "us-east-1").ondemand_micros == _offering(
        base, "g5.xlarge", "us-east-1").ondemand_micros
    assert any("us-east-1: kept the previous catalog's on-demand price" in n for n in res.notes)
    assert any("no on-demand price known" in n for n in res.notes)  # e.g. m6i.metal: nothing to keep
    # Instance types from describe_instance_types, GPU names in catalog spelling.
    assert cat.types["p4de.24xlarge"].accelerator == "A100-80GB"
    assert cat.types["p4d.24xlarge"].gpu_memory_mib == 40960 and cat.types["m6i.8xlarge"].vcpus == 32
    # The account's zone mapping is recorded; other regions are kept as they were.
    zones = fake_aws.client().describe_availability_zones()["AvailabilityZones"]
    assert all(cat.zone_names[z["ZoneName"]] == z["ZoneId"] for z in zones)
    assert cat.offerings("p5.48xlarge") == tuple(o for o in base.offerings("p5.48xlarge")
                                                 if o.region not in ("us-east-1", "eu-north-1"))
    assert _offering(cat, "p4d.24xlarge", "us-west-2") == _offering(base, "p4d.24xlarge", "us-west-2")
    assert cat.built_at != base.built_at and "AWS EC2 APIs" in cat.source
    # The optimizer ranks with the new prices: the refreshed spot price wins.
    plan = place([R(instance_type="p4d.24xlarge", use_spot=True)], 1, cat)
    assert plan.chosen.hourly_price_micros == MOTO_SPOT_MICROS
    assert plan.chosen.region in ("eu-north-1", "us-east-1")
    # A zone name is now usable for spot: the account mapping resolves it.
    name = next(z["ZoneName"] for z in zones if z["ZoneId"] in _moto_zones(fake_aws, "us-east-1", "p4d.24xlarge"))
    by_name = place([R(zone=name, instance_type="p4d.24xlarge", use_spot=True)], 1, cat)
    assert by_name.chosen.zone == cat.zone_names[name]


def test_refresh_keeps_on_demand_prices_when_the_price_api_fails(fake_aws: FakeAws) -> None:
    base = shipped_catalog()
    sess = _session(fake_aws)
    # moto has no Price List API: every call fails, as an unreachable endpoint would.
    src = PricingApiSource.from_session(sess, endpoint_url=fake_aws.endpoint_url, max_attempts=1)
    res = refresh_catalog(base, ["us-east-1"], families=["p4d"], session=sess,
                          endpoint_url=fake_aws.endpoint_url, price_source=src)
    assert any("us-east-1: on-demand prices unavailable from AWS Price List API" in n for n in res.notes)
    assert any("kept the previous catalog's on-demand price for 1 type(s)" in n for n in res.notes)
    assert _offering(res.catalog, "p4d.24xlarge", "us-east-1").ondemand_micros == _offering(
        base, "p4d.24xlarge", "us-east-1").ondemand_micros


def test_a_failing_region_keeps_its_previous_data(fake_aws: FakeAws) -> None:
    base = shipped_catalog()
    fake_aws.add_fault("UnauthorizedOperation", action="DescribeAvailabilityZones", region="eu-north-1")
    res = refresh_catalog(base, ["us-east-1", "eu-north-1"], families=["p4d"], session=_session(fake_aws),
                          endpoint_url=fake_aws.endpoint_url, price_source=None, max_attempts=1)
    assert res.regions_refreshed == ["us-east-1"]
    assert "UnauthorizedOperation" in res.regions_failed["eu-north-1"]
    assert _offering(res.catalog, "p4d.24xlarge", "eu-north-1") == _offering(base, "p4d.24xlarge", "eu-north-1")
    assert {z.spot_micros for z in _offering(res.catalog, "p4d.24xlarge", "us-east-1").zones} == {MOTO_SPOT_MICROS}


def test_live_spot_refresh_is_region_scoped(fake_aws: FakeAws) -> None:
    base = shipped_catalog()
    before = fake_aws.request_count("DescribeSpotPriceHistory")
    cat = refresh_spot_prices(base, "us-east-1", ["p4d.24xlarge", "g5.xlarge"], session=_session(fake_aws),
                              endpoint_url=fake_aws.endpoint_url)
    assert fake_aws.request_count("DescribeSpotPriceHistory") == before + 1  # one call for the region
    p4d = _offering(cat, "p4d.24xlarge", "us-east-1")
    moto_zones = _moto_zones(fake_aws, "us-east-1", "p4d.24xlarge")
    assert {z.zone for z in p4d.zones if z.spot_micros == MOTO_SPOT_MICROS} == moto_zones
    # Zones AWS gave no price for are unknown now, not stale.
    assert all(z.spot_micros is None for z in p4d.zones if z.zone not in moto_zones)
    assert _offering(cat, "p4d.24xlarge", "us-west-2") == _offering(base, "p4d.24xlarge", "us-west-2")
    assert cat.offerings("m6i.large") == base.offerings("m6i.large")  # not asked: untouched
    assert "us-east-1" in cat.spot_refreshed_at and not base.spot_refreshed_at
    plan = place([R(instance_type="p4d.24xlarge", use_spot=True)], 1, cat)
    assert (plan.chosen.region, plan.chosen.hourly_price_micros) == ("us-east-1", MOTO_SPOT_MICROS)


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


def test_cli_catalog_refresh_and_show(app: typer.Typer, fake_aws: FakeAws, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in fake_aws.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    monkeypatch.delenv("SKYPURZA_CATALOG", raising=False)
    res = CliRunner().invoke(app, ["catalog", "refresh", "--regions", "us-east-1", "--families", "p4d",
                                   "--no-pricing-api", "-o", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    path = tmp_path / "catalog" / "aws.json"
    assert out["path"] == str(path) and out["regions_refreshed"] == ["us-east-1"] and path.exists()
    assert "refreshing 1 region(s)" in res.stderr  # progress goes to stderr
    cat = load_catalog(use_cache=False)
    assert {z.spot_micros for z in _offering(cat, "p4d.24xlarge", "us-east-1").zones} == {MOTO_SPOT_MICROS}
    show = CliRunner().invoke(app, ["catalog", "show", "-o", "json"])
    assert json.loads(show.stdout)["path"] == str(path)


def test_cli_check_with_credentials(app: typer.Typer, fake_aws: FakeAws, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in fake_aws.env.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(app, ["check", "aws", "local", "gcp", "-o", "json"])
    assert res.exit_code == 0, res.output
    by = {s["infra"]: s for s in json.loads(res.stdout)["infras"]}
    assert by["aws"]["enabled"] and fake_aws.account_id in by["aws"]["detail"]
    assert by["local"]["enabled"] and not by["gcp"]["enabled"]


def test_cli_check_when_aws_does_not_answer(app: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    res = CliRunner().invoke(app, ["check", "aws", "-o", "json"])
    aws = json.loads(res.stdout)["infras"][0]
    assert not aws["enabled"] and "did not answer" in aws["reason"] and "STS" in aws["reason"]
