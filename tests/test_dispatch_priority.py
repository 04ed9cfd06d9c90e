"""Slurm's multifactor priority (services/dispatch/priority.py): the formula, truncation and
clamping of `_get_priority_internal`, each factor's own rule, the priority_multifactor.html
configuration example worked through, properties, and `spz dispatch prio --explain` run as a
real `spz` process (the issue's input and output shapes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skypurza.services.dispatch import priority as p
from skypurza.services.dispatch.whatif import WhatIfError, explain, parse_explain

DAY = 86400

ISSUE_EXPLAIN = {"weights": {"fairshare": 10000, "age": 1000, "jobsize": 1000, "qos": 1000},
                 "factors": {"fairshare": 0.25, "age": 0.0, "qos": 0.0},
                 "jobsize_inputs": {"min_nodes": 1, "nodes_total": 1, "cpus": 1, "cpus_total": 2},
                 "tres_weights": {"cpu": 1000, "mem": 2000, "gres/gpu": 3000},
                 "tres_factors": {"cpu": 0.5, "mem": 0.5, "gres/gpu": 0.25}}


def test_the_issue_example_worked_by_hand():
    out = explain(*parse_explain(ISSUE_EXPLAIN))
    # fairshare 0.25 x 10000; jobsize (1/1 + 1/2)/2 = 0.75 x 1000; TRES 500 + 1000 + 750
    assert out["fairshare"] == 2500.0 and out["jobsize"] == 750.0 and out["age"] == 0.0 and out["qos"] == 0.0
    assert out["tres"] == {"cpu": 500.0, "mem": 1000.0, "gres/gpu": 750.0}
    assert out["priority"] == 5500 and isinstance(out["priority"], int)


def test_the_documented_configuration_example():
    # priority_multifactor.html "Configuration Example": PriorityDecayHalfLife=14-0,
    # PriorityMaxAge=14-0, weights Age 1000, Fairshare 10000, JobSize 1000, Partition 1000, QOS 0.
    # A job of User1 in the classic example (FairShare 0.408479) that waited 7 of its 14 days,
    # asking 4 of 16 nodes and 64 of 512 CPUs, in a partition of PriorityJobFactor 10 where the
    # highest is 20 (the page's "partitions 20 and 10 with weight 5000 give 5000 and 2500").
    w = p.Weights(age=1000, fairshare=10000, jobsize=1000, partition=1000, qos=0)
    f = p.Factors(age=p.age_factor(7 * DAY, 14 * DAY), fairshare=0.408479,
                  jobsize=p.jobsize_factor(4, 16, 64, 512), partition=p.normalised(10, 20), qos=1.0)
    r = p.priority(w, f)
    assert f.age == 0.5 and f.jobsize == (4 / 16 + 64 / 512) / 2 and f.partition == 0.5
    assert r.weighted == {"age": 500.0, "assoc": 0.0, "fairshare": pytest.approx(4084.79), "jobsize": 187.5,
                          "partition": 500.0, "qos": 0.0}
    assert r.priority == 5272  # 500 + 4084.79 + 187.5 + 500 = 5272.29, truncated
    assert p.priority(p.Weights(partition=5000), p.Factors(partition=p.normalised(20, 20))).priority == 5000
    assert p.priority(p.Weights(partition=5000), p.Factors(partition=p.normalised(10, 20))).priority == 2500


def test_truncated_and_clamped_as_slurm():
    assert p.clamp(5272.999) == 5272
    assert p.clamp(0.0) == 1 and p.clamp(0.99) == 1 and p.clamp(-5e9) == 1  # 0 means held
    assert p.clamp(2.0 ** 40) == p.UINT32_MAX
    # nice is subtracted unweighted; a negative nice raises it
    assert p.priority(p.Weights(fairshare=1000), p.Factors(fairshare=1.0, nice=100)).priority == 900
    assert p.priority(p.Weights(fairshare=1000), p.Factors(fairshare=1.0, nice=-100)).priority == 1100
    assert p.priority(p.Weights(fairshare=1000), p.Factors(fairshare=0.0, nice=5000)).priority == 1
    assert p.priority(p.Weights(), p.Factors(site=42)).priority == 42


def test_age_factor_maxes_out():
    assert p.age_factor(0) == 0.0
    assert p.age_factor(3.5 * DAY) == 0.5  # default PriorityMaxAge 7-0
    assert p.age_factor(7 * DAY) == 1.0 and p.age_factor(70 * DAY) == 1.0
    assert p.age_factor(59.9, 120) == 59 / 120  # whole seconds, as Slurm's uint32 diff


def test_job_size_factor_rules():
    assert p.jobsize_factor(16, 16, 512, 512) == 1.0  # the whole machine
    assert p.jobsize_factor(1, 16, 0, 512) == 1 / 16  # no CPU count: nodes alone, not halved
    assert p.jobsize_factor(1, 16, 1, 512, favor_small=True) == pytest.approx(((15 / 16) + (511 / 512)) / 2)
    # SMALL_RELATIVE_TO_TIME: a full-system job with a one-minute limit gets 1.0
    assert p.jobsize_factor(16, 16, 512, 512, relative_to_time=True, time_limit_min=1) == 1.0
    assert p.jobsize_factor(1, 16, 4, 512, relative_to_time=True, time_limit_min=60) == pytest.approx(32 / 60 / 512)
    assert p.jobsize_factor(1, 16, 4, 512, relative_to_time=True, time_limit_min=60, favor_small=True) == \
        pytest.approx(1 - 32 / 60 / 512)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=6, max_size=6), st.lists(st.integers(0, p.UINT32_MAX), min_size=6, max_size=6),
       st.floats(0, 1), st.floats(0, 1))
def test_priority_is_an_int_in_range_and_monotone_in_each_factor(factors, weights, lo, hi):
    w = p.Weights(**dict(zip(p.FACTORS, weights)))
    f = p.Factors(**dict(zip(p.FACTORS, factors)))
    r = p.priority(w, f)
    assert isinstance(r.priority, int) and 1 <= r.priority <= p.UINT32_MAX
    lo, hi = min(lo, hi), max(lo, hi)
    for name in p.FACTORS:
        a = p.priority(w, p.Factors(**{**dict(zip(p.FACTORS, factors)), name: lo})).priority
        b = p.priority(w, p.Factors(**{**dict(zip(p.FACTORS, factors)), name: hi})).priority
        assert a <= b


@pytest.mark.parametrize("data, message", [
    ({"weights": {"age": 1.5}}, "weights.age: 1.5 is not accepted; accepted: a whole number from 0 to 4294967295"),
    ({"weights": {"fairshare": 2 ** 32}}, "weights.fairshare: 4294967296 is not accepted"),
    ({"factors": {"fairshare": 1.2}}, "factors.fairshare: 1.2 is not accepted; accepted: a number from 0 to 1"),
    ({"factors": {"age": True}}, "factors.age: true is not accepted"),
    ({"wieghts": {}}, "wieghts: unknown key; accepted: weights, factors"),
    ({"factors": {"jobsize": 0.5}, "jobsize_inputs": {"cpus": 1, "cpus_total": 2}}, "given with jobsize_inputs"),
    ({"jobsize_inputs": {"min_nodes": 5, "nodes_total": 4}}, "jobsize_inputs.min_nodes: 5 is not accepted; accepted: a whole number from 0 to 4"),
    ({"tres_factors": {"gres/gpu": 0.5}}, "tres_factors.gres/gpu: no weight in tres_weights"),
    ({"tres_weights": {"GPU!": 1}}, "tres_weights.GPU!: not a TRES name"),
    ({"nice": 2 ** 31}, "nice: 2147483648 is not accepted"),
])
def test_a_bad_explain_file_names_the_key(data, message):
    with pytest.raises(WhatIfError) as err:
        parse_explain(data, "e.json")
    assert str(err.value).startswith("e.json") and message in str(err.value)


def spz(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_NO_PLUGINS", "SKYPURZA_DEBUG")}
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_spz_dispatch_prio_explain_json(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps(ISSUE_EXPLAIN))
    res = spz("dispatch", "prio", "--explain", "e.json", "-o", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["priority"] == 5500
    assert (out["fairshare"], out["jobsize"], out["age"], out["qos"]) == (2500.0, 750.0, 0.0, 0.0)
    assert out["tres"] == {"cpu": 500.0, "mem": 1000.0, "gres/gpu": 750.0}
    assert out["factors"]["jobsize"] == 0.75
    (tmp_path / "empty.json").write_text("{}")  # every key may be absent: priority 1, never 0
    empty = spz("dispatch", "prio", "--explain", "empty.json", "-o", "json", cwd=tmp_path)
    assert empty.returncode == 0 and json.loads(empty.stdout)["priority"] == 1
    table = spz("dispatch", "prio", "--explain", "e.json", cwd=tmp_path)
    assert table.returncode == 0 and "5500" in table.stdout and "PRIORITY" in table.stdout


def test_spz_dispatch_prio_bad_file_is_one_line(tmp_path):
    (tmp_path / "e.json").write_text(json.dumps({"weights": {"age": -1}}))
    res = spz("dispatch", "prio", "--explain", "e.json", "-o", "json", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert "e.json: weights.age: -1 is not accepted; accepted: a whole number from 0 to 4294967295" in res.stderr
    assert "Traceback" not in res.stderr
    (tmp_path / "d").mkdir()
    res = spz("dispatch", "prio", "--explain", "d", cwd=tmp_path)
    assert res.returncode == 2 and "d: is a directory" in res.stderr and "Traceback" not in res.stderr
