"""On-demand price sources for `catalog refresh` (pluggable: EC2 itself has no on-demand prices).

- `PricingApiSource`: the AWS Price List Query API (`pricing:GetProducts`), Linux, shared
  tenancy, no pre-installed software, capacity status "Used" (the plain on-demand price).
- `CatalogPriceSource`: the prices of an existing catalog (what `refresh` keeps when the API
  cannot be reached, e.g. against moto, which does not implement the Pricing API).

A source returns what it could price; `refresh` keeps the previous price of any type it could
not price, and says so in its notes.
"""

from __future__ import annotations

import json
from typing import Any, Collection, Iterable, Protocol

from .model import Catalog, dollars_to_micros

# The Price List API has endpoints in these regions only; any of them answers for every region.
PRICING_API_REGION = "us-east-1"


class PriceSourceError(RuntimeError):
    pass


class OnDemandPriceSource(Protocol):
    name: str

    def prices(self, region: str, instance_types: Collection[str]) -> dict[str, int]:
        """On-demand micro-USD/hour per instance type in `region` (only those it could price)."""
        ...


class CatalogPriceSource:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.name = f"catalog built {catalog.built_at}"

    def prices(self, region: str, instance_types: Collection[str]) -> dict[str, int]:
        out = {}
        for t in instance_types:
            for o in self.catalog.offerings(t):
                if o.region == region and o.ondemand_micros is not None:
                    out[t] = o.ondemand_micros
        return out


def parse_price_list_item(item: str | dict[str, Any]) -> tuple[str, str, int] | None:
    """(region code, instance type, micro-USD/hour) of one GetProducts PriceList entry."""
    d = json.loads(item) if isinstance(item, str) else item
    attrs = d.get("product", {}).get("attributes", {})
    itype, region = attrs.get("instanceType"), attrs.get("regionCode")
    if not itype or not region:
        return None
    best: int | None = None
    for term in d.get("terms", {}).get("OnDemand", {}).values():
        for dim in term.get("priceDimensions", {}).values():
            usd = dim.get("pricePerUnit", {}).get("USD")
            if usd is None or dim.get("unit") not in ("Hrs", "Hours", "hours"):
                continue
            micros = dollars_to_micros(usd)
            if micros > 0 and (best is None or micros < best):
                best = micros
    return (region, itype, best) if best is not None else None


def _filters(region: str, instance_type: str | None = None) -> list[dict[str, str]]:
    f = {
        "regionCode": region, "operatingSystem": "Linux", "tenancy": "Shared",
        "preInstalledSw": "NA", "capacitystatus": "Used", "licenseModel": "No License required",
    }
    if instance_type:
        f["instanceType"] = instance_type
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in f.items()]


class PricingApiSource:
    """AWS Price List Query API. `client` is a boto3 `pricing` client (region us-east-1)."""

    name = "AWS Price List API (pricing:GetProducts)"

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    def from_session(cls, session: Any, endpoint_url: str | None = None, max_attempts: int = 3) -> "PricingApiSource":
        from botocore.config import Config

        return cls(session.client("pricing", region_name=PRICING_API_REGION, endpoint_url=endpoint_url,
                                  config=Config(retries={"max_attempts": max_attempts, "mode": "standard"})))

    def _items(self, filters: list[dict[str, str]]) -> Iterable[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            for page in self.client.get_paginator("get_products").paginate(
                    ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1",
                    PaginationConfig={"PageSize": 100}):
                yield from page.get("PriceList", [])
        except (BotoCoreError, ClientError) as e:
            raise PriceSourceError(str(e)) from e

    def prices(self, region: str, instance_types: Collection[str]) -> dict[str, int]:
        wanted = set(instance_types)
        out: dict[str, int] = {}
        # Few types: one query each; many: the whole region (a few pages) and keep ours.
        queries = [_filters(region, t) for t in sorted(wanted)] if len(wanted) <= 5 else [_filters(region)]
        for q in queries:
            for item in self._items(q):
                parsed = parse_price_list_item(item)
                if parsed and parsed[0] == region and parsed[1] in wanted:
                    _, t, micros = parsed
                    out[t] = min(micros, out.get(t, micros))
        return out
