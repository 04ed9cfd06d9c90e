"""The pure placement decision over the shipped catalog: ranking, filters, blocks, failover order."""

from __future__ import annotations

import dataclasses
import random

import pytest

from skypurza.events.models import TaskSubmitted
from skypurza.events.taskspec.request import ResourceRequest as R
from skypurza.services.optimizer.catalog import load_catalog
from skypurza.services.optimizer.catalog.model import Catalog
from skypurza.services.optimizer.decide import initial_blocks
from skypurza.services.optimizer.local import LocalResources
from skypurza.services.optimizer.placement import (
    Block,
    Candidate,
    apply_blocks,
    block_for_error,
    default_enabled_infras,
    next_placement,
    place,
    quota_class,
)


@pytest.fixture(scope="module")
def cat() -> Catalog:
    return load_catalog(use_cache=False)


def brute_ondemand(cat: Catalog, instance_type: str) -> list[tuple[int, str]]:
    """(price, region) of every on-demand offering: an independent reading of the catalog."""
    return sorted((o.ondemand_micros, o.region) for o in cat.offerings(instance_type) if o.ondemand_micros)


def brute_spot(cat: Catalog, instance_type: str) -> list[tuple[int, str, str]]:
    return sorted((z.spot_micros, o.region, z.zone) for o in cat.offerings(instance_type) for z in o.zones
                  if z.spot_micros is not None and z.zone.count("-") == 1)


# ------------------------------------------------------------------------------ ranking

def test_cheapest_region_wins_with_deterministic_ties(cat: Catalog) -> None:
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat)
    expected = brute_ondemand(cat, "p5.48xlarge")
    assert plan.chosen is not None
    assert (plan.chosen.hourly_price_micros, plan.chosen.region) == expected[0]
    # Three regions tie at the lowest price: the tie-break is the region name.
    tied = [r for p, r in expected if p == expected[0][0]]
    assert len(tied) > 1 and plan.chosen.region == min(tied)
    assert plan.chosen.zone is None and plan.chosen.zones  # on-demand: any zone of the region
    assert plan.chosen.accelerators == {"H100": 8.0}
    assert [(c.hourly_price_micros, c.region) for c in plan.candidates] == expected


def test_all_feasible_types_ranked_by_price_not_only_the_cheapest(cat: Catalog) -> None:
    plan = place([R(accelerator="A10G", accelerator_count=1)], 1, cat)
    types = {c.instance_type for c in plan.candidates}
    assert {"g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.16xlarge"} <= types
    prices = [c.total_hourly_price_micros for c in plan.candidates]
    assert prices == sorted(prices)
    assert plan.chosen.instance_type == "g5.xlarge"


def test_default_cpu_instance_like_skypilot(cat: Catalog) -> None:
    plan = place([R()], 1, cat)
    assert plan.chosen.instance_type == "m6i.2xlarge"  # 8 vCPUs, 32 GiB: cpus 8+, memory 4x
    for c in plan.candidates:
        fam = c.instance_type.split(".")[0]
        assert fam in {"m6i", "r6i", "c6i"}
        assert c.vcpus >= 8 and c.memory_gib >= 4 * c.vcpus and not c.accelerators


def test_cpus_and_memory_exact_plus_and_ratio(cat: Catalog) -> None:
    exact = place([R(cpus=4, memory_gib=16)], 1, cat)
    assert {c.instance_type for c in exact.candidates} == {"m6i.xlarge"}
    plus = place([R(cpus=16, cpus_plus=True, memory_gib=100, memory_plus=True)], 1, cat)
    assert plus.candidates and all(c.vcpus >= 16 and c.memory_gib >= 100 for c in plus.candidates)
    ratio = place([R(cpus=2, memory_ratio=8)], 1, cat)
    assert {c.instance_type for c in ratio.candidates} == {"r6i.large"}
    # More than the default families offer: fall back to any CPU type (SkyPilot gives up here).
    big = place([R(cpus=64, cpus_plus=True)], 1, cat)
    assert big.chosen and big.chosen.instance_type.startswith("m5.") and big.chosen.vcpus >= 64


def test_gpu_request_with_cpu_minimum(cat: Catalog) -> None:
    plan = place([R(accelerator="a10g", accelerator_count=1, cpus=32, cpus_plus=True)], 1, cat)
    assert {c.instance_type for c in plan.candidates} == {"g5.8xlarge", "g5.16xlarge"}


def test_instance_type_pin_and_a_wrong_pin(cat: Catalog) -> None:
    plan = place([R(instance_type="p4d.24xlarge")], 1, cat)
    assert {c.instance_type for c in plan.candidates} == {"p4d.24xlarge"}
    bad = place([R(instance_type="p4d.24xlarg")], 1, cat)
    assert not bad.feasible and "not in the AWS catalog" in bad.reason and "p4d.24xlarge" in bad.reason
    clash = place([R(instance_type="g5.xlarge", accelerator="H100", accelerator_count=1)], 1, cat)
    assert "g5.xlarge has A10G:1, not H100:1" in clash.reason


def test_spot_candidates_are_per_zone_with_zone_prices(cat: Catalog) -> None:
    plan = place([R(instance_type="p4d.24xlarge", use_spot=True)], 3, cat)
    assert [(c.hourly_price_micros, c.region, c.zone) for c in plan.candidates] == brute_spot(cat, "p4d.24xlarge")
    c = plan.chosen
    assert c.use_spot and c.zones == (c.zone,)
    assert c.total_hourly_price_micros == 3 * c.hourly_price_micros


def test_local_zones_only_when_named(cat: Catalog) -> None:
    it = next(t for t in cat.types for o in cat.offerings(t) for z in o.zones
              if z.zone == "use1-atl2-az1" and z.spot_micros)
    anywhere = place([R(instance_type=it, use_spot=True)], 1, cat)
    assert all("atl" not in c.zone for c in anywhere.candidates)
    named = place([R(instance_type=it, use_spot=True, zone="use1-atl2-az1")], 1, cat)
    assert [c.zone for c in named.candidates] == ["use1-atl2-az1"]


def test_max_hourly_cost(cat: Catalog) -> None:
    plan = place([R(accelerator="T4", accelerator_count=1, max_hourly_cost=0.6)], 1, cat)
    assert plan.candidates and all(c.hourly_price_micros <= 600_000 for c in plan.candidates)
    none = place([R(accelerator="T4", accelerator_count=1, max_hourly_cost=0.1)], 1, cat)
    assert "above max_hourly_cost $0.10/h" in none.reason and "$0.526/h" in none.reason


def test_image_id_per_region_restricts_and_resolves(cat: Catalog) -> None:
    images = {"us-west-2": "ami-west", "eu-north-1": "ami-north"}
    plan = place([R(accelerator="H100", accelerator_count=8, image_id=images)], 1, cat)
    assert {c.region for c in plan.candidates} == set(images)
    assert all(c.image_id == images[c.region] for c in plan.candidates)
    plain = place([R(accelerator="H100", accelerator_count=8, image_id="ami-x")], 1, cat)
    assert {c.image_id for c in plain.candidates} == {"ami-x"}
    nowhere = place([R(accelerator="H100", accelerator_count=8, image_id={"af-south-1": "ami-a"})], 1, cat)
    assert "image_id names only af-south-1" in nowhere.reason


def test_disk_size_and_num_nodes(cat: Catalog) -> None:
    plan = place([R(accelerator="L4", accelerator_count=1, disk_size_gb=512)], 4, cat)
    c = plan.chosen
    assert c.disk_size_gb == 512 and c.num_nodes == 4 and c.total_hourly_price_micros == 4 * c.hourly_price_micros
    assert place([R()], 1, cat).chosen.disk_size_gb == 256


# ------------------------------------------------------------------------------ alternatives

def test_any_of_spot_and_on_demand_interleave_by_price(cat: Catalog) -> None:
    plan = place([R(instance_type="p4d.24xlarge", use_spot=True), R(instance_type="p4d.24xlarge")], 1, cat)
    markets = [c.use_spot for c in plan.candidates]
    assert True in markets and False in markets
    prices = [c.total_hourly_price_micros for c in plan.candidates]
    assert prices == sorted(prices)
    first_od = markets.index(False)
    assert any(markets[first_od:])  # a spot zone comes after an on-demand region: interleaved


def test_ordered_keeps_user_order_over_price(cat: Catalog) -> None:
    plan = place([R(accelerator="H100", accelerator_count=8, order=0),
                  R(accelerator="T4", accelerator_count=1, order=1)], 1, cat)
    accs = [next(iter(c.accelerators)) for c in plan.candidates]
    assert accs[0] == "H100" and "T4" in accs
    assert accs == sorted(accs, key=lambda a: a != "H100")  # every H100 before any T4


def test_ordered_first_entry_infeasible_falls_to_second_with_a_note(cat: Catalog) -> None:
    plan = place([R(accelerator="H200", accelerator_count=16, order=0),
                  R(accelerator="H200", accelerator_count=8, order=1)], 1, cat)
    assert plan.chosen.accelerators == {"H200": 8.0}
    assert any("no AWS region offers H200:16" in n for n in plan.notes)


def test_any_of_result_does_not_depend_on_request_order(cat: Catalog) -> None:
    reqs = [R(accelerator="A10G", accelerator_count=1), R(accelerator="L4", accelerator_count=1),
            R(accelerator="T4", accelerator_count=1, use_spot=True)]
    base = place(reqs, 1, cat).candidates
    rng = random.Random(7)
    for _ in range(5):
        shuffled = reqs[:]
        rng.shuffle(shuffled)
        again = place(shuffled, 1, cat).candidates
        assert [c.key() for c in again] == [c.key() for c in base]


# ------------------------------------------------------------------------------ infra filters

def test_region_and_zone_filters(cat: Catalog) -> None:
    plan = place([R(cloud="aws", region="eu-north-1", accelerator="H100", accelerator_count=8)], 1, cat)
    assert {c.region for c in plan.candidates} == {"eu-north-1"}
    z = place([R(zone="use2-az2", instance_type="p5.48xlarge", use_spot=True)], 1, cat)
    assert [(c.region, c.zone) for c in z.candidates] == [("us-east-2", "use2-az2")]
    od = place([R(zone="use2-az2", instance_type="p5.48xlarge")], 1, cat)
    assert [(c.region, c.zone, c.zones) for c in od.candidates] == [("us-east-2", "use2-az2", ("use2-az2",))]
    clash = place([R(region="us-west-2", zone="use2-az2", instance_type="p5.48xlarge")], 1, cat)
    assert "zone use2-az2 is in region us-east-2, not us-west-2" in clash.reason


def test_zone_names_need_a_mapping_for_spot_only(cat: Catalog) -> None:
    od = place([R(zone="us-east-1a", instance_type="m6i.large")], 1, cat)
    assert [(c.region, c.zone) for c in od.candidates] == [("us-east-1", "us-east-1a")]
    spot = place([R(zone="us-east-1a", instance_type="m6i.large", use_spot=True)], 1, cat)
    assert not spot.feasible and "cannot be mapped to an ID" in spot.reason and "use1-az" in spot.reason
    mapped = cat.with_offerings({}, zone_names={"us-east-1a": "use1-az4"})
    ok = place([R(zone="us-east-1a", instance_type="m6i.large", use_spot=True)], 1, mapped)
    assert [c.zone for c in ok.candidates] == ["use1-az4"]


def test_unknown_region(cat: Catalog) -> None:
    plan = place([R(region="us-east-7", instance_type="m6i.large")], 1, cat)
    assert "AWS region 'us-east-7' is not in the catalog" in plan.reason


@pytest.mark.parametrize("cloud", ["gcp", "azure", "ssh", "lambda"])  # kubernetes, slurm: their own tests
def test_clouds_we_do_not_run_say_so(cat: Catalog, cloud: str) -> None:
    plan = place([R(cloud=cloud, accelerator="A100", accelerator_count=8)], 1, cat)
    assert not plan.feasible
    assert "is not supported yet" in plan.reason and "aws" in plan.reason.lower()


def test_aws_not_enabled(cat: Catalog) -> None:
    plan = place([R(cloud="aws")], 1, cat, enabled_infras=())
    assert "AWS is not enabled" in plan.reason and "spz check" in plan.reason


def test_wildcard_cloud_is_any(cat: Catalog) -> None:
    assert place([R(cloud="*", instance_type="m6i.large")], 1, cat).chosen.infra == "aws"


# ------------------------------------------------------------------------------ infeasible

def test_infeasible_accelerator_count_names_the_closest(cat: Catalog) -> None:
    plan = place([R(accelerator="H200", accelerator_count=16)], 1, cat)
    assert not plan.feasible
    cheapest_h200 = min((o.ondemand_micros, o.region, t) for t in ("p5e.48xlarge", "p5en.48xlarge")
                        for o in cat.offerings(t) if o.ondemand_micros)
    _, region, itype = cheapest_h200
    assert plan.reason.startswith("no AWS region offers H200:16; closest: H200:8 on ")
    assert f"H200:8 on {itype} in {region}" in plan.reason
    assert "num_nodes" in plan.reason


def test_infeasible_unknown_and_non_aws_accelerators(cat: Catalog) -> None:
    typo = place([R(accelerator="H10O", accelerator_count=8)], 1, cat)
    assert "unknown accelerator 'H10O'" in typo.reason
    tpu = place([R(accelerator="tpu-v4", accelerator_count=8)], 1, cat)
    assert "tpu-v4 is offered by GCP, which SkyPurza does not run yet" in tpu.reason
    b200 = place([R(accelerator="b200", accelerator_count=8)], 1, cat)
    assert "no AWS instance type in the catalog has B200" in b200.reason and "spz catalog refresh" in b200.reason


def test_infeasible_region_and_market(cat: Catalog) -> None:
    where = place([R(accelerator="H200", accelerator_count=8, region="af-south-1")], 1, cat)
    assert "is not offered in af-south-1; it is offered in:" in where.reason
    od = place([R(instance_type="p5e.48xlarge")], 1, cat)
    assert "is not sold on demand" in od.reason and "use_spot: true" in od.reason


def test_gpu_memory_form(cat: Catalog) -> None:
    plan = place([R(accelerator="80GB+", accelerator_count=8)], 1, cat)
    assert {c.instance_type for c in plan.candidates} >= {"p4de.24xlarge", "p5.48xlarge"}
    assert all(cat.types[c.instance_type].gpu_memory_mib >= 72_000 for c in plan.candidates)


# ------------------------------------------------------------------------------ local

LOCAL = LocalResources(cpus=16, memory_gib=64.0, gpus={"L4": 2})


def test_local_candidate_costs_nothing_and_ranks_first(cat: Catalog) -> None:
    plan = place([R(accelerator="L4", accelerator_count=1)], 1, cat, enabled_infras=("aws", "local"),
                 local_resources=LOCAL)
    c = plan.chosen
    assert (c.infra, c.hourly_price_micros, c.accelerators, c.vcpus) == ("local", 0, {"L4": 1}, 16.0)
    assert plan.candidates[1].infra == "aws"


def test_local_only_when_enabled_or_asked(cat: Catalog) -> None:
    off = place([R(cpus=2)], 1, cat, enabled_infras=("aws",), local_resources=LOCAL)
    assert all(c.infra == "aws" for c in off.candidates)
    asked = place([R(cloud="local", cpus=2)], 1, cat, enabled_infras=("aws",), local_resources=LOCAL)
    assert [c.infra for c in asked.candidates] == ["local"]
    pinned = place([R(cloud="aws", cpus=2)], 1, cat, enabled_infras=("aws", "local"), local_resources=LOCAL)
    assert all(c.infra == "aws" for c in pinned.candidates)


def test_local_that_does_not_fit_says_why(cat: Catalog) -> None:
    gpus = place([R(cloud="local", accelerator="L4", accelerator_count=1)], 3, cat, local_resources=LOCAL)
    assert "this machine has L4:2" in gpus.reason and "3 nodes" in gpus.reason
    spot = place([R(cloud="local", use_spot=True)], 1, cat, local_resources=LOCAL)
    assert "no spot market" in spot.reason
    h100 = place([R(cloud="local", accelerator="H100", accelerator_count=1)], 1, cat,
                 local_resources=LocalResources(2, 8.0, {}))
    assert "no NVIDIA GPU" in h100.reason


def test_local_without_cloud_credentials(cat: Catalog) -> None:
    enabled = default_enabled_infras([])
    assert enabled == {"local"}
    plan = place([R(cpus=2, cpus_plus=True)], 1, cat, enabled_infras=enabled, local_resources=LOCAL)
    assert [c.infra for c in plan.candidates] == ["local"]
    assert default_enabled_infras(["aws"]) == {"aws"}
    assert default_enabled_infras(["aws"], allowed_infras=["aws", "local"]) == {"aws", "local"}


def test_local_block(cat: Catalog) -> None:
    plan = place([R(cpus=2)], 1, cat, enabled_infras=("aws", "local"), local_resources=LOCAL)
    b = block_for_error(plan.chosen, "unsupported")
    after = next_placement(plan, [b])
    assert after.chosen.infra == "aws"


# ------------------------------------------------------------------------------ blocks and failover

def test_block_for_error_scopes(cat: Catalog) -> None:
    spot = place([R(instance_type="p4d.24xlarge", use_spot=True)], 1, cat).chosen
    od = place([R(instance_type="p4d.24xlarge")], 1, cat).chosen
    assert block_for_error(spot, "capacity") == Block("spot_market", "aws", spot.region, spot.zone,
                                                      "p4d.24xlarge", True, error_class="capacity")
    assert block_for_error(od, "capacity", zone=od.zones[0]) == Block(
        "zone", "aws", od.region, od.zones[0], "p4d.24xlarge", None, error_class="capacity")
    assert block_for_error(od, "capacity").scope == "region"
    q = block_for_error(od, "quota")
    assert (q.scope, q.region, q.zone, q.instance_type, q.use_spot, q.quota_class) == (
        "region", od.region, None, None, False, "P")
    u = block_for_error(spot, "unsupported")
    assert (u.scope, u.zone, u.use_spot) == ("candidate", spot.zone, True)
    assert block_for_error(od, "auth") == Block("infra", "aws", error_class="auth")
    # Every block the optimizer makes travels as a FailoverBlock and comes back the same.
    made = [q, u, block_for_error(spot, "capacity"), block_for_error(od, "capacity", zone=od.zones[0]),
            block_for_error(od, "auth")]
    sub = TaskSubmitted(task_id="t", cluster="c", task={}, initial_blocks=[b.to_dict() for b in made])
    assert initial_blocks(sub) == made and [b.to_dict() for b in sub.initial_blocks] == [b.to_dict() for b in made]
    assert [quota_class(t) for t in ("p5.48xlarge", "g6e.xlarge", "m6i.large", "inf2.xlarge", "vt1.3xlarge")] == [
        "P", "G", "Standard", "Inf", "G"]


def test_spot_capacity_error_tries_other_zones_of_the_region_first(cat: Catalog) -> None:
    plan = place([R(instance_type="p4d.24xlarge", use_spot=True)], 1, cat)
    first = plan.chosen
    blocks = [block_for_error(first, "capacity")]
    nxt = next_placement(plan, blocks, first)
    assert nxt.chosen.region == first.region and nxt.chosen.zone != first.zone
    # Plain rank order would have left the region: the rule matters here.
    ranked = next_placement(plan, blocks, first, same_region_first=False)
    assert ranked.chosen.region != first.region
    assert ranked.chosen.hourly_price_micros < nxt.chosen.hourly_price_micros
    # Once every zone of the region failed, the next cheapest region follows.
    while nxt.chosen.region == first.region:
        blocks.append(block_for_error(nxt.chosen, "spot_capacity"))
        nxt = next_placement(plan, blocks, nxt.chosen)
    assert nxt.chosen == ranked.chosen


def test_on_demand_capacity_error_retries_the_region_in_other_zones(cat: Catalog) -> None:
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat)
    first = plan.chosen
    failed_zone = first.zones[0]
    nxt = next_placement(plan, [block_for_error(first, "capacity", zone=failed_zone)], first)
    assert nxt.chosen.region == first.region
    assert nxt.chosen.zones == first.zones[1:]
    # The inferred affinity (no `last`) gives the same answer: the newest block names the place.
    assert next_placement(plan, [block_for_error(first, "capacity", zone=failed_zone)]).chosen == nxt.chosen


def test_quota_error_skips_the_region_for_that_market_and_class(cat: Catalog) -> None:
    reqs = [R(instance_type="p4d.24xlarge"), R(instance_type="p4d.24xlarge", use_spot=True),
            R(accelerator="A10G", accelerator_count=1)]
    plan = place(reqs, 1, cat)
    od = next(c for c in plan.candidates if c.instance_type == "p4d.24xlarge" and not c.use_spot)
    blocks = [block_for_error(od, "quota")]
    nxt = next_placement(plan, blocks, od)
    left = nxt.candidates
    assert not any(c.region == od.region and not c.use_spot and c.instance_type.startswith("p") for c in left)
    assert any(c.region == od.region and c.use_spot and c.instance_type == "p4d.24xlarge" for c in left)
    assert any(c.region == od.region and c.instance_type.startswith("g5") and not c.use_spot for c in left)
    p4d_od = [c for c in left if c.instance_type == "p4d.24xlarge" and not c.use_spot]
    assert p4d_od and all(c.region != od.region for c in p4d_od)


def test_spot_then_on_demand_fallback(cat: Catalog) -> None:
    plan = place([R(instance_type="p5.48xlarge", use_spot=True, order=0),
                  R(instance_type="p5.48xlarge", use_spot=False, order=1)], 1, cat)
    n_spot = sum(c.use_spot for c in plan.candidates)
    assert all(c.use_spot for c in plan.candidates[:n_spot]) and n_spot < len(plan.candidates)
    blocks: list[Block] = []
    cur = plan
    for _ in range(n_spot):
        assert cur.chosen.use_spot
        blocks.append(block_for_error(cur.chosen, "spot_capacity"))
        cur = next_placement(plan, blocks, cur.chosen)
    assert cur.chosen is not None and not cur.chosen.use_spot
    expected = brute_ondemand(cat, "p5.48xlarge")[0]
    assert (cur.chosen.hourly_price_micros, cur.chosen.region) == expected


def test_exhausted_candidates_give_a_reason(cat: Catalog) -> None:
    plan = place([R(instance_type="p5.4xlarge")], 1, cat)
    blocks = [block_for_error(c, "unsupported") for c in plan.candidates]
    done = next_placement(plan, blocks)
    assert not done.feasible and f"all {len(plan.candidates)} candidate place(s)" in done.reason
    # place() with the same blocks agrees.
    again = place([R(instance_type="p5.4xlarge")], 1, cat, blocks=blocks)
    assert not again.feasible and "tried and is blocked" in again.reason


def test_blocks_given_to_place_equal_next_placement_set(cat: Catalog) -> None:
    plan = place([R(accelerator="L4", accelerator_count=1, use_spot=True), R(accelerator="L4", accelerator_count=1)],
                 2, cat)
    rng = random.Random(3)
    blocks = [block_for_error(c, rng.choice(["capacity", "spot_capacity", "quota", "unsupported"]))
              for c in rng.sample(plan.candidates, 20)]
    direct = place([R(accelerator="L4", accelerator_count=1, use_spot=True), R(accelerator="L4", accelerator_count=1)],
                   2, cat, blocks=blocks)
    assert {(c.key(), c.zones) for c in direct.candidates} == {
        (c.key(), c.zones) for c in next_placement(plan, blocks, same_region_first=False).candidates}


def test_apply_blocks_and_candidate_round_trip(cat: Catalog) -> None:
    c = place([R(accelerator="H100", accelerator_count=8)], 2, cat).chosen
    assert Candidate.from_dict(c.to_dict()) == c
    zb = Block("zone", "aws", c.region, c.zones[0], c.instance_type)
    assert apply_blocks(c, [zb]).zones == c.zones[1:]
    assert apply_blocks(c, [Block("region", "aws", c.region)]) is None
    assert apply_blocks(c, [Block("region", "aws", "elsewhere-1")]) is c


def test_no_fit_anywhere_names_every_infra(cat: Catalog) -> None:
    plan = place([R(accelerator="H100", accelerator_count=8)], 1, cat, enabled_infras=("local",),
                 local_resources=LOCAL)
    assert "local: the task asks for H100:8" in plan.reason and "AWS is not enabled" in plan.reason


def test_limited_ranking_is_exactly_the_head_of_the_full_ranking():
    """place(limit=K) stops expanding types early; its first K candidates must be the full
    ranking's first K, for every accelerator of the catalog, CPU minimums, both markets, with blocks."""
    from skypurza.services.optimizer.catalog import load_catalog
    from skypurza.services.optimizer.placement import block_for_error, place

    cat = load_catalog()
    requests = [[R(accelerator=a, accelerator_count=c, use_spot=s)]
                for a in cat.accelerators() for c in sorted({t.accelerator_count for t in cat.types_with_accelerator(a)})
                for s in (False, True)]
    requests += [[R(cpus=c, cpus_plus=True, memory_gib=m, memory_plus=True, use_spot=s)]
                 for c in (2, 8, 17, 48) for m in (4, 64) for s in (False, True)]
    requests += [[R(), R(use_spot=True)], [R(accelerator="A10G", accelerator_count=1, use_spot=True),
                                           R(accelerator="L4", accelerator_count=1)]]
    checked = 0
    for reqs in requests:
        for k in (1, 5, 64):
            full = place(reqs, 2, cat, enabled_infras=("aws",))
            limited = place(reqs, 2, cat, enabled_infras=("aws",), limit=k)
            assert limited.candidates[:k] == full.candidates[:k], (reqs, k)
            if full.candidates:
                blocks = [block_for_error(full.candidates[0], "capacity"), block_for_error(full.candidates[0], "quota")]
                assert place(reqs, 2, cat, blocks, ("aws",), limit=k).candidates[:k] == \
                    place(reqs, 2, cat, blocks, ("aws",)).candidates[:k]
                checked += 1
    assert checked > 40


def test_placement_anywhere_is_the_union_of_every_region(cat: Catalog) -> None:
    """A request naming no region reads the index's precomputed places (issue 21); a request
    naming a region takes the general loop. The first must be exactly the second, region by
    region: same candidates, same prices and zones, with blocks and a price cap too."""
    requests = [R(cpus=8, cpus_plus=True, memory_gib=32, memory_plus=True), R(use_spot=True),
                R(accelerator="A10G", accelerator_count=1, use_spot=True), R(accelerator="L4", accelerator_count=1),
                R(cpus=2, cpus_plus=True, max_hourly_cost=0.2), R(cpus=2, cpus_plus=True, use_spot=True,
                                                                  max_hourly_cost=0.05)]
    checked = 0
    for req in requests:
        anywhere = place([req], 2, cat, enabled_infras=("aws",))
        assert anywhere.candidates, req
        first = anywhere.candidates[0]
        for blocks in ([], [block_for_error(first, "capacity", zone=first.zones[0]), block_for_error(first, "quota")]):
            anywhere = place([req], 2, cat, blocks, ("aws",))
            for region in cat.regions:
                pinned = place([dataclasses.replace(req, region=region)], 2, cat, blocks, ("aws",))
                assert [c for c in anywhere.candidates if c.region == region] == list(pinned.candidates), (req, region)
                checked += len(pinned.candidates)
    assert checked > 200


def test_placement_anywhere_says_why_nothing_fits_as_before(cat: Catalog) -> None:
    """The counts behind the reason (offered, sold in the market, under the price cap) come
    from the index on the fast path: the reasons stay the same."""
    plan = place([R(cpus=2, cpus_plus=True, max_hourly_cost=0.000001)], 1, cat, enabled_infras=("aws",))
    assert plan.reason is not None and "above max_hourly_cost" in plan.reason and "any AWS region" in plan.reason
    plan = place([R(accelerator="P4de" if "P4de" in cat.accelerators() else "A100-80GB", accelerator_count=8,
                    use_spot=True)], 1, cat, enabled_infras=("aws",))
    assert plan.candidates or (plan.reason and "not sold spot" in plan.reason), plan.reason


def test_event_candidates_equal_the_validated_ones(cat: Catalog) -> None:
    """decide builds the events' candidates from placement's without validating them again; each
    must be the model the validating constructor gives (fields, types, what is set, the JSON)."""
    from skypurza.events.types import Candidate as EventCandidate
    from skypurza.services.optimizer import decide

    reqs = [R(cpus=4, cpus_plus=True), R(use_spot=True), R(accelerator="L4", accelerator_count=1, disk_size_gb=500),
            R(accelerator="A100", accelerator_count=8, use_spot=True)]
    local = LocalResources(cpus=8, memory_gib=32.0, gpus={})
    seen = 0
    for n in (1, 3):
        for c in place(reqs, n, cat, enabled_infras=("aws", "local"), local_resources=local).candidates:
            zone = c.zone or (c.zones[0] if c.zones else None)
            got = decide.to_event_candidate(c)
            want = EventCandidate(infra=c.infra, region=c.region, zone=zone, zones=list(c.zones),
                                  instance_type=c.instance_type, accelerators=c.accelerators, use_spot=c.use_spot,
                                  vcpus=c.vcpus, memory_gib=c.memory_gib, hourly_price_micros=c.hourly_price_micros,
                                  num_nodes=c.num_nodes, image_id=c.image_id, disk_size_gb=c.disk_size_gb)
            assert got == want and got.model_fields_set == want.model_fields_set
            assert got.model_dump_json() == want.model_dump_json() and repr(got) == repr(want)
            assert got.zones is not c.zones and (c.accelerators is None or got.accelerators is not c.accelerators)
            seen += 1
    # A value of another type (an int count from elsewhere) takes the validating path: converted as before.
    odd = place([R(cpus=4, cpus_plus=True)], 1, cat, enabled_infras=("aws",)).candidates[0]._replace(
        vcpus=4, accelerators={"L4": 1})
    converted = decide.to_event_candidate(odd)
    assert type(converted.vcpus) is float and converted.accelerators == {"L4": 1.0}
    assert type(converted.accelerators["L4"]) is float
    assert seen > 100


def test_requests_that_select_the_same_types_share_one_expansion(cat: Catalog) -> None:
    """A sweep of distinct cpus and memory minimums selects few distinct sets of instance types:
    each set is expanded once per catalog (`CatalogIndex.anywhere`, issue 21). Every plan is
    exactly what a cold expansion gives, and what a caller does to the list it got changes no
    later answer."""
    from skypurza.services.optimizer.placement import _candidates_anywhere, index_for

    index = index_for(cat)
    index.anywhere.clear()  # only a memo: the other tests' entries would hide the count below
    sweep = [R(cpus=c, cpus_plus=True, memory_gib=m, memory_plus=True, use_spot=s)
             for c in range(2, 40, 3) for m in (4, 9, 15, 40) for s in (False, True)]
    for r in sweep:  # fill the memo
        place([r], 2, cat, enabled_infras=("aws",), limit=32)
    assert 0 < len(index.anywhere) < len(sweep) // 3  # shared: far fewer expansions than requests
    warm = [place([r], 2, cat, enabled_infras=("aws",), limit=32) for r in sweep]
    for r, plan in zip(sweep, warm):
        index.anywhere.clear()
        assert place([r], 2, cat, enabled_infras=("aws",), limit=32) == plan, r
        # Ranked once in the memo and taken as it is; with a second request (which adds nothing
        # here) `place` ranks the whole list itself: the same candidates in the same order.
        nothing = R(instance_type="no-such-type.xlarge")
        assert place([r, nothing], 2, cat, enabled_infras=("aws",), limit=32).candidates == plan.candidates, r
    types = index.cpu_types()[1][:8]
    got = _candidates_anywhere(0, types, 1, index, [], 32, False, None, 100, 0, None)
    assert got[0]
    got[0].clear()
    assert _candidates_anywhere(0, types, 1, index, [], 32, False, None, 100, 0, None)[0]


def test_plan_heads_convert_each_candidate_once_to_the_same_model(cat: Catalog) -> None:
    """decide converts a plan head's candidates once per content (issue 21): what it hands out is
    the model a fresh conversion gives, and a candidate equal to a converted one but of other
    types (an int where placement has a float) still gets the normalised model."""
    from skypurza.services.optimizer import decide

    decide._EVENT_CANDIDATES.clear()
    plan = place([R(cpus=4, cpus_plus=True), R(accelerator="L4", accelerator_count=1)], 1, cat,
                 enabled_infras=("aws",))
    head = decide._event_candidates(plan)
    assert len(head) == decide.REMAINING_SHOWN + 1 and len(decide._EVENT_CANDIDATES) == len(head)
    again = decide._event_candidates(plan)
    assert all(a is b for a, b in zip(again, head))  # remembered, not converted again
    fresh = [decide.to_event_candidate(c) for c in plan.candidates[:len(head)]]
    assert [h.model_dump_json() for h in head] == [f.model_dump_json() for f in fresh] and head == fresh
    gpu = next(c for c in plan.candidates if c.accelerators)
    odd = gpu._replace(vcpus=int(gpu.vcpus), accelerators={k: int(v) for k, v in gpu.accelerators.items()})
    got = decide._event_candidate(odd)
    assert type(got.vcpus) is float and all(type(v) is float for v in got.accelerators.values())
    assert got == decide.to_event_candidate(gpu)
