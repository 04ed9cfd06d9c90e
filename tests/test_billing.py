"""Slurm billing: Slurm's documented examples (tres and priority_multifactor pages), the
integer Slurm stores, MAX_TRES / MAX_TRES_GRES, memory units, errors, and the CLI."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from skypurza.services.ledger.cli import register
from skypurza.services.ledger.billing import (
    BillingMode,
    TresVector,
    billing,
    billing_mode,
    billing_seconds,
    double_counted_gres,
    fairshare_usage,
    grp_tres_minutes,
    parse_priority_flags,
    parse_tres,
    parse_weights,
    weights_for_team,
)
from skypurza.services.ledger.metering import instance_tres

TRES_PAGE_WEIGHTS = "CPU=1.0,Mem=0.25G,GRES/gpu=2.0,license/licA=1.5"
MULTIFACTOR_WEIGHTS = "CPU=1.0,Mem=0.25G"


def bill(weights: str, tres: str, flags: str = "") -> tuple[Decimal, int]:
    r = billing(weights, tres, flags)
    return r.billing, r.billing_int


# ---------------------------------------------------------------------------------------------
# tres page (doc/html/tres.shtml), "Billing Weights" and "Priority Flags"


def test_tres_page_sum_example_1cpu_8gib() -> None:
    # (1*1.0) + (8*0.25) + (0*2.0) + (0*1.5) = 3.0
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G") == (Decimal(3), 3)


def test_tres_page_license_makes_4_5_stored_as_4() -> None:
    # (1*1.0) + (8*0.25) + (0*2.0) + (1*1.5) = 4.5 => 4
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G,license/licA=1") == (Decimal("4.5"), 4)


def test_tres_page_more_memory_and_license_makes_5() -> None:
    # (1*1.0) + (10*0.25) + (0*2.0) + (1*1.5) = 5.0 => 5
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=10G,license/licA=1") == (Decimal(5), 5)


def test_tres_page_max_tres_example() -> None:
    # MAX(1*1.0, 8*0.25, 0*2.0) + (0*1.5) = 2.0
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G", "MAX_TRES") == (Decimal(2), 2)


def test_tres_page_max_tres_gres_examples() -> None:
    # (0*2.0) + MAX(1*1.0, 8*0.25) + (0*1.5) = 2.0
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G", "MAX_TRES_GRES") == (Decimal(2), 2)
    # The page then writes "(1*2.0) + MAX(1*1.0, 8*0.25) + (0*1.5) = 3.0" for one GPU; its
    # own terms add up to 2.0 + 2.0 = 4.0, which is what the formula gives.
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G,gres/gpu=1", "MAX_TRES_GRES") == (Decimal(4), 4)
    # Under MAX_TRES the GPU competes in the MAX instead: MAX(1, 2, 2) = 2.
    assert bill(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G,gres/gpu=1", "MAX_TRES") == (Decimal(2), 2)


def test_tres_page_memory_weight_suffix() -> None:
    # mem=0.25 on 8 GiB -> 2048 (8192 MiB * 0.25); mem=0.25G -> 2 ((8192/1024) * 0.25)
    assert bill("mem=0.25", "mem=8G") == (Decimal(2048), 2048)
    assert bill("mem=0.25G", "mem=8G") == (Decimal(2), 2)


def test_no_weights_bills_allocated_cpus() -> None:
    # "By default, jobs are billed against the total number of allocated CPUs" (CPU=1)
    assert bill("", "cpu=7,mem=64G,gres/gpu=4") == (Decimal(7), 7)
    assert bill("", "cpu=7,mem=64G,gres/gpu=4", "MAX_TRES") == (Decimal(7), 7)


# ---------------------------------------------------------------------------------------------
# priority_multifactor page, fair-share section: 16 CPU / 64 GB nodes


@pytest.mark.parametrize(
    ("tres", "exact", "stored"),
    [
        ("cpu=1,mem=60G", Decimal(16), 16),  # Job1: (1*1.0) + (60*0.25) = 16
        ("cpu=16,mem=1G", Decimal("16.25"), 16),  # Job2: (16*1.0) + (1*0.25) = 16.25
        ("cpu=16,mem=60G", Decimal(31), 31),  # Job3: (16*1.0) + (60*0.25) = 31
    ],
)
def test_multifactor_page_sum_examples(tres: str, exact: Decimal, stored: int) -> None:
    assert bill(MULTIFACTOR_WEIGHTS, tres) == (exact, stored)


def test_multifactor_page_max_examples_as_printed() -> None:
    # The page's MAX_TRES lines, with the sizes exactly as it prints them.
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=1,mem=60G", "MAX_TRES") == (Decimal(15), 15)
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=15,mem=1G", "MAX_TRES") == (Decimal(15), 15)
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=16,mem=64G", "MAX_TRES") == (Decimal(16), 16)


def test_multifactor_page_max_examples_for_the_same_jobs() -> None:
    # The page says "the above job's billable TRES" but changes Job2 to 15 CPUs and Job3 to
    # 64 GB. For the jobs of the SUM example the MAX_TRES values are 15, 16 and 16.
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=1,mem=60G", "MAX_TRES")[0] == 15
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=16,mem=1G", "MAX_TRES")[0] == 16
    assert bill(MULTIFACTOR_WEIGHTS, "cpu=16,mem=60G", "MAX_TRES")[0] == 16


# ---------------------------------------------------------------------------------------------
# The two billing numbers and what accrues them (slurm-accounting.md, observed on Slurm 22.05)


@pytest.mark.parametrize(("value", "stored"), [("5.25", 5), ("13.906", 13), ("26.25", 26)])
def test_alloc_tres_billing_is_truncated(value: str, stored: int) -> None:
    r = billing(f"CPU={value}", "cpu=1")
    assert r.billing == Decimal(value)
    assert r.billing_int == stored


def test_fairshare_accrues_the_untruncated_value_sreport_the_integer() -> None:
    r = billing("CPU=5.25", "cpu=1")
    # bob: RawUsage 78 (sshare truncates 78.75), not 5 * 15 = 75
    assert fairshare_usage(r, 15) == Decimal("78.75")
    assert int(fairshare_usage(r, 15)) == 78
    assert billing_seconds(r, 15) == 75


def test_qos_usage_factor_scales_raw_usage() -> None:
    r = billing("CPU=1", "cpu=16")
    assert fairshare_usage(r, 22, "0.5") == 176
    assert fairshare_usage(r, 71, "0.5") == 568


def test_grp_tres_raw_is_whole_minutes_of_integer_billing_seconds() -> None:
    assert grp_tres_minutes(1030) == 17
    # sreport per user: sum of int(billing) * ElapsedRaw
    r = billing(TRES_PAGE_WEIGHTS, "cpu=1,mem=8G,license/licA=1")  # 4.5 -> 4
    assert billing_seconds(r, 90) == 360


def test_stored_integer_follows_slurms_double_not_the_exact_value() -> None:
    # 0.29 is not a binary fraction: 100 * 0.29 is 28.999999999999996 as a double.
    r = billing("CPU=0.29", "cpu=100")
    assert r.billing == Decimal(29)
    assert r.billing_double == 100 * 0.29 < 29
    assert r.billing_int == 28


# ---------------------------------------------------------------------------------------------
# MAX_TRES vs MAX_TRES_GRES: GRES are node TRES for MAX_TRES, summed for MAX_TRES_GRES


def test_gres_compete_in_max_tres_but_add_in_max_tres_gres() -> None:
    w = "CPU=1,GRES/gpu=4,license/lic=3"
    t = "cpu=8,gres/gpu=1,license/lic=2"
    assert bill(w, t) == (Decimal(18), 18)  # 8 + 4 + 6
    assert bill(w, t, "MAX_TRES") == (Decimal(14), 14)  # MAX(8, 4) + 6
    assert bill(w, t, "MAX_TRES_GRES") == (Decimal(18), 18)  # MAX(8) + 4 + 6
    t4 = "cpu=8,gres/gpu=4,license/lic=2"
    assert bill(w, t4, "MAX_TRES") == (Decimal(22), 22)  # MAX(8, 16) + 6
    assert bill(w, t4, "MAX_TRES_GRES") == (Decimal(30), 30)  # 8 + 16 + 6


def test_node_count_is_a_node_tres() -> None:
    assert bill("CPU=1,Node=100", "cpu=4,node=2", "MAX_TRES") == (Decimal(200), 200)
    assert bill("CPU=1,Node=100", "cpu=4,node=2", "MAX_TRES_GRES") == (Decimal(200), 200)


def test_other_priority_flags_do_not_change_billing() -> None:
    assert billing_mode("FAIR_TREE,ACCRUE_ALWAYS") is BillingMode.SUM
    assert billing_mode("max_tres, NO_NORMAL_ALL") is BillingMode.MAX_TRES
    assert parse_priority_flags(["max_tres_gres"]) == {"MAX_TRES_GRES"}


def test_max_starts_at_zero_so_negative_node_values_do_not_subtract() -> None:
    # Slurm's MAX accumulator starts at 0.0: a negative node value never lowers the total.
    assert bill("CPU=-1,license/lic=5", "cpu=3,license/lic=1", "MAX_TRES") == (Decimal(5), 5)
    assert bill("CPU=-1,license/lic=5", "cpu=3,license/lic=1") == (Decimal(2), 2)


def test_gres_typed_and_untyped_both_billed_as_slurm_does() -> None:
    # An untyped --gres=gpu:1 is recorded as gres/gpu=1 and gres/gpu:h100=1; weighting both
    # bills 2 + 4 per GPU. Slurm does that; we reproduce it and report the pair.
    w = parse_weights("CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0")
    tres = TresVector.of(instance_tres(192, 2048, "H100", 8))
    r = billing(w, tres)
    assert r.billing == 192 + 2048 * Decimal("0.25") + 8 * 2 + 8 * 4
    assert double_counted_gres(w) == [("gres/gpu", "gres/gpu:h100")]
    assert double_counted_gres(parse_weights("CPU=1,GRES/gpu:h100=4")) == []


def test_billing_tres_is_never_weighted() -> None:
    # sacct AllocTRES carries billing=; a weight on billing is ignored like Slurm ignores it.
    alloc = "billing=13,cpu=2,gres/gpu=4,mem=16000M,node=1"
    assert bill("CPU=1,Billing=100,GRES/gpu=2", alloc) == (Decimal(10), 10)


# ---------------------------------------------------------------------------------------------
# Memory units as Slurm reads them


@pytest.mark.parametrize("mem", ["8192", "8192M", "8G", "8g", "8388608K", "0.0078125T"])
def test_memory_values_are_mib(mem: str) -> None:
    assert parse_tres(f"mem={mem}").get("mem") == 8192


def test_memory_value_must_be_whole_mib() -> None:
    assert parse_tres("mem=1.5G").get("mem") == 1536
    with pytest.raises(ValueError, match=r"15994.88 MiB.*whole MiB.*mem=15994M"):
        parse_tres("mem=15.62G")


@pytest.mark.parametrize(
    ("weight", "per_mib"),
    [
        ("0.25", Decimal("0.25")),
        ("0.25K", Decimal("0.25")),  # K is below the MiB base unit: no division
        ("0.25M", Decimal("0.25")),
        ("0.25G", Decimal("0.25") / 1024),
        ("1T", Decimal(1) / 1024**2),
        ("1P", Decimal(1) / 1024**3),
        ("0.25g", Decimal("0.25") / 1024),
    ],
)
def test_memory_weight_suffix_divides_from_mib(weight: str, per_mib: Decimal) -> None:
    assert parse_weights(f"Mem={weight}").exact("mem") == per_mib


def test_count_weight_suffix_divides_from_one() -> None:
    assert bill("CPU=1K", "cpu=2048") == (Decimal(2), 2)
    assert bill("CPU=1M", "cpu=1048576") == (Decimal(1), 1)
    with pytest.raises(ValueError, match="overflows Slurm's unit conversion"):
        parse_weights("CPU=1T")


def test_burst_buffer_is_mib_based_like_memory() -> None:
    assert bill("bb/datawarp=1G", "bb/datawarp=2G") == (Decimal(2), 2)


def test_tres_text_round_trips() -> None:
    t = parse_tres("gres/gpu:h100=2,node=1,mem=8G,cpu=4,gres/gpu=2")
    assert t.to_text() == "cpu=4,mem=8192M,node=1,gres/gpu=2,gres/gpu:h100=2"
    assert parse_tres(t.to_text()) == t


def test_weights_are_case_insensitive_quoted_and_last_wins() -> None:
    a = parse_weights('"cpu=1.0,,MEM=0.25g,gres/GPU:H100=4"')
    b = parse_weights("CPU=9,CPU=1.0,Mem=0.25G,GRES/gpu:h100=4")
    assert {k: w.exact for k, w in a.weights.items()} == {k: w.exact for k, w in b.weights.items()}


def test_team_weights() -> None:
    table = {"vision": "CPU=1,GRES/gpu:h100=8"}
    assert bill(weights_for_team("vision", table).text, "cpu=2,gres/gpu:h100=1")[0] == 10
    assert not weights_for_team("nlp", table).defined
    assert weights_for_team(None, table, "CPU=2").exact("cpu") == 2


# ---------------------------------------------------------------------------------------------
# Errors say which token and what is accepted


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("CPU", r"invalid TRES weight entry 'CPU'.*<TRES>=<weight>"),
        ("CPU=", r"invalid TRES weight entry 'CPU='"),
        ("=1", r"invalid TRES weight entry '=1'"),
        ("GPU=2", r"unknown TRES 'GPU'; accepted: cpu, mem"),
        ("gres=2", r"'gres' needs a name"),
        ("cpu/x=1", r"cpu takes no name"),
        ("fs/nfs=1", r"fs must be one of fs/disk, fs/lustre"),
        ("CPU=abc", r"weight 'CPU=abc': 'abc' is not a number"),
        ("CPU=inf", r"'inf' is not a number"),
        ("Mem=0.25GB", r"weight 'Mem=0.25GB': unknown unit 'GB'.*K, M, G, T, P"),
        ("Mem=0.25X", r"unknown unit 'X'"),
        ("gres/gpu h100=1", r"bad name 'gpu h100'"),
    ],
)
def test_weight_errors(weights: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_weights(weights)


@pytest.mark.parametrize(
    ("tres", "message"),
    [
        ("cpu=1.5", r"'cpu=1.5': cpu takes a non-negative integer count"),
        ("cpu=-1", r"cpu takes a non-negative integer count"),
        ("cpu=2,cpu=3", r"TRES cpu given twice"),
        ("mem=8GB", r"'mem=8GB': mem takes a size such as 8192, 8192M, 8G"),
        ("cpu", r"invalid TRES entry 'cpu'.*<TRES>=<count>"),
        ("gpu=1", r"unknown TRES 'gpu'"),
    ],
)
def test_tres_errors(tres: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tres(tres)


def test_flag_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown PriorityFlags value 'MAX'; accepted: .*MAX_TRES"):
        billing_mode("MAX")
    with pytest.raises(ValueError, match="alternatives; set one"):
        billing_mode("MAX_TRES,MAX_TRES_GRES")


def test_negative_total_is_refused() -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        billing("CPU=-1", "cpu=2")


# ---------------------------------------------------------------------------------------------
# Properties


_weight = st.decimals(min_value=0, max_value=100, places=3, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    cpu=st.integers(0, 512),
    mem=st.integers(0, 4_194_304),
    gpu=st.integers(0, 16),
    lic=st.integers(0, 8),
    wc=_weight,
    wm=_weight,
    wg=_weight,
    wl=_weight,
)
def test_mode_ordering_and_stored_integer(cpu, mem, gpu, lic, wc, wm, wg, wl) -> None:
    w = parse_weights(f"CPU={wc},Mem={wm}G,GRES/gpu={wg},License/lic={wl}")
    t = TresVector.of({"cpu": cpu, "mem": mem, "gres/gpu": gpu, "license/lic": lic})
    s, mx, mg = (billing(w, t, f) for f in ("", "MAX_TRES", "MAX_TRES_GRES"))
    # With non-negative weights MAX_TRES <= MAX_TRES_GRES <= SUM.
    assert mx.billing <= mg.billing <= s.billing
    assert s.billing == cpu * wc + mem * wm / 1024 + gpu * wg + lic * wl
    for r in (s, mx, mg):
        assert r.billing_int == math.trunc(r.billing_double)
        assert abs(Decimal(r.billing_double) - r.billing) <= Decimal("1e-9") * (1 + r.billing)


# ---------------------------------------------------------------------------------------------
# CLI


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


def test_cli_json_prints_exact_value_and_stored_integer() -> None:
    res = CliRunner().invoke(
        _app(),
        ["ledger", "billing", "--weights", TRES_PAGE_WEIGHTS, "--tres", "cpu=1,mem=8192M,license/licA=1", "-o", "json"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"billing": 4.5, "billing_int": 4}


def test_cli_flags_and_double_count_warning() -> None:
    res = CliRunner().invoke(
        _app(),
        [
            "ledger", "billing",
            "--weights", "CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:h100=4.0",
            "--flags", "MAX_TRES_GRES",
            "--tres", "cpu=4,mem=8G,node=1,gres/gpu=2,gres/gpu:h100=2",
            "-o", "json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"billing": 16.0, "billing_int": 16}  # MAX(4, 2) + 4 + 8
    assert "gres/gpu and gres/gpu:h100 are weighted" in res.stderr


def test_cli_json_keeps_every_digit() -> None:
    res = CliRunner().invoke(_app(), ["ledger", "billing", "--weights", "CPU=0.29", "--tres", "cpu=100", "-o", "json"])
    assert res.stdout.strip() == '{"billing": 29.0, "billing_int": 28}'
    res = CliRunner().invoke(_app(), ["ledger", "billing", "--weights", "Mem=1G", "--tres", "mem=1", "-o", "json"])
    assert res.stdout.strip() == '{"billing": 0.0009765625, "billing_int": 0}'


def test_cli_table_shows_terms_and_both_numbers() -> None:
    res = CliRunner().invoke(
        _app(), ["ledger", "billing", "--weights", MULTIFACTOR_WEIGHTS, "--tres", "cpu=16,mem=1G"]
    )
    assert res.exit_code == 0, res.output
    assert "16.25" in res.stdout
    assert "billing_int (stored)   16" in res.stdout


def test_cli_bad_input_names_the_option_and_token() -> None:
    res = CliRunner().invoke(_app(), ["ledger", "billing", "--weights", "CPU=1,Mem=2X", "--tres", "cpu=1"])
    assert res.exit_code == 2
    assert "--weights" in res.output and "Mem=2X" in res.output
    res = CliRunner().invoke(_app(), ["ledger", "billing", "--tres", "cpu=1", "--flags", "MAXTRES"])
    assert res.exit_code == 2
    assert "MAXTRES" in res.output
