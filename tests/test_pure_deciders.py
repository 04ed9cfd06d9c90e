"""The optimizer's deciders are pure, and every service reads its settings one way.

- decide/placement read no environment and no disk (a trapped os.environ and file system do not
  change a thing, and a fresh interpreter under two very different environments decides the same);
- place() leaves the catalog exactly as it found it (a deep snapshot);
- the plan cache is keyed by the catalog's content: equal catalogs share an entry, and a changed
  catalog that lands at the old catalog's address (so has its id) gets its own plan;
- the settings base (events/settings.py): each bound at its limit and past it, bad types, the
  error text; every service's settings checked against the ranges the docs give;
- the node agent's settings (environment only) and the choices (log level, bucket store);
- config.yaml read by the task spec's bounded YAML loader: file:line:column errors, aliases,
  size, encoding, a named pipe refused at once;
- "AWS is configured" (events/awsconfig.py) as a table;
- a bad setting reaching a services process (or a node agent) is one clear line, exit 2.
"""

from __future__ import annotations

import builtins
import copy
import gc
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from skypurza.events import naming
from skypurza.events.awsconfig import AWS_ENV_SIGNALS, aws_config_files, aws_configured
from skypurza.events.config import ConfigError, load_config
from skypurza.events.limits import MAX_YAML_FILE_BYTES
from skypurza.events.models import CapacityError, PlacementChosen, PlacementFailed, TaskSubmitted
from skypurza.events.settings import SettingsError, Sources, parse_flag, parse_integer, parse_names, parse_number
from skypurza.events.taskspec.request import ResourceRequest as R
from skypurza.services.ledger.ledgerconfig import TICK_ENV, parse_ledger_config
from skypurza.services.agent.settings import AgentSettings
from skypurza.services.optimizer import decide, placement
from skypurza.services.optimizer.catalog import Catalog, codec, load_catalog
from skypurza.services.optimizer.catalog.model import InstanceType, Offering, ZoneOffer
from skypurza.services.optimizer.placement import Block, block_for_error, place
from skypurza.services.optimizer.settings import OptimizerSettings
from skypurza.services.provisioner.settings import ProvisionerSettings
from skypurza.services.recovery.settings import RecoverySettings

TASKS = [
    {"resources": {"accelerators": "V100:1", "use_spot": True}, "run": "x"},
    {"resources": {"accelerators": "A100:8"}, "run": "x"},
    {"resources": {"cpus": "4+", "memory": "16+"}, "run": "x"},
    {"resources": {"any_of": [{"accelerators": "L4:1", "use_spot": True}, {"accelerators": "L4:1"}]}, "run": "x"},
]
REQUESTS = [
    [R()], [R(use_spot=True)], [R(accelerator="H100", accelerator_count=8)],
    [R(accelerator="A10G", accelerator_count=1, use_spot=True), R(accelerator="A10G", accelerator_count=1)],
    [R(instance_type="p4d.24xlarge", region="us-east-1")], [R(cpus=32, cpus_plus=True, use_spot=True)],
]


def _decisions(cat: Catalog, world: decide.World) -> list[Any]:
    """Every kind of decision, as plain data: plans (full and limited, with blocks) and events."""
    out: list[Any] = []
    for reqs in REQUESTS:
        for limit in (None, 5):
            plan = place(reqs, 2, cat, (), ("aws",), None, limit=limit)
            out.append([c.to_dict() for c in plan.candidates] + [plan.reason])
            if plan.chosen is not None:
                blocks = [block_for_error(plan.chosen, "capacity")]
                nxt = placement.next_placement(place(reqs, 2, cat, blocks, ("aws",), limit=limit), blocks)
                out.append([c.to_dict() for c in nxt.candidates[:5]])
    for i, task in enumerate(TASKS):
        sub = TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task=task)
        first = decide.first_placement(sub, world)
        out.append(first.model_dump(mode="json"))
        if isinstance(first, PlacementChosen):
            err = CapacityError(task_id=sub.task_id, cluster=sub.cluster, placement_id="p", attempt=first.attempt,
                                candidate=first.candidate, error_class="capacity", code="X", message="m")
            out.append(decide.after_capacity_error(sub, [err], world).model_dump(mode="json"))
    return out


def _forget_caches() -> None:
    decide._PLAN_CACHE.clear()
    placement._INDEXES.clear()


def test_an_invalid_task_is_never_placed_whether_or_not_its_resources_have_a_cached_plan() -> None:
    """A hand-made TaskSubmitted whose task is invalid fails placement with what is wrong; a plan
    cached for the same resources (a valid task's) must not place it (a hit decides as a miss)."""
    world = decide.World(load_catalog(), frozenset({"aws"}), None, max_attempts=5)
    good = {"resources": {"cpus": "2+"}, "run": "echo hi", "envs": {"OK": "1"}}
    bad = {**good, "envs": {"1BAD": "1"}}
    for cached in (False, True):
        _forget_caches()
        placed = decide.first_placement(TaskSubmitted(task_id="g", cluster="g", task=good), world)
        assert isinstance(placed, PlacementChosen)
        if not cached:
            _forget_caches()
        sub = TaskSubmitted(task_id="b", cluster="b", task=bad)
        failed = decide.first_placement(sub, world)
        assert isinstance(failed, PlacementFailed), (cached, failed)
        assert failed.reason.startswith("invalid task: envs.1BAD: invalid environment variable name"), failed.reason
        err = CapacityError(task_id="b", cluster="b", placement_id="p", attempt=1, candidate=placed.candidate,
                            error_class="capacity", code="X", message="m")
        again = decide.after_capacity_error(sub, [err], world)
        assert isinstance(again, PlacementFailed) and "invalid task: envs.1BAD" in again.reason


class _Trapped(dict):
    """An os.environ that fails the test on any read."""

    def _no(self, *a: Any, **k: Any) -> Any:
        raise AssertionError(f"a decider read the environment ({a[:1]})")

    __getitem__ = get = __contains__ = __iter__ = __len__ = keys = items = values = copy = _no  # type: ignore[assignment]


def test_deciders_read_no_environment_and_no_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    cat = load_catalog()
    world = decide.World(cat, frozenset({"aws"}), None, max_attempts=5)
    _forget_caches()
    expected = _decisions(cat, world)
    _forget_caches()

    def no_disk(*a: Any, **k: Any) -> Any:
        raise AssertionError(f"a decider touched the disk ({a[:1]})")

    with monkeypatch.context() as m:
        m.setattr(os, "environ", _Trapped())
        m.setattr(Path, "home", classmethod(no_disk))
        for name in ("exists", "is_file", "stat", "read_text", "read_bytes", "open"):
            m.setattr(Path, name, no_disk)
        m.setattr(builtins, "open", no_disk)
        got = _decisions(cat, world)
    assert got == expected


_DECIDE_IN_A_FRESH_PROCESS = """
import json
from skypurza.events.models import CapacityError, TaskSubmitted
from skypurza.services.optimizer import decide
from skypurza.services.optimizer.catalog import codec
from skypurza.services.optimizer.catalog.loader import SHIPPED_FILE
cat = codec.loads(SHIPPED_FILE.read_bytes())
world = decide.World(cat, frozenset({"aws"}), None)
out = []
for i, task in enumerate(json.loads(%r)):
    sub = TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task=task)
    first = decide.first_placement(sub, world)
    out.append(first.model_dump(mode="json"))
    # attempt 64 is the default limit: a decider that read SKYPURZA_MAX_PLACEMENT_ATTEMPTS would differ
    if getattr(first, "candidate", None) is not None:
        errs = [CapacityError(task_id=sub.task_id, cluster=sub.cluster, placement_id="p", attempt=n,
                              candidate=first.candidate, error_class="capacity", code="X", message="m")
                for n in (1, 2)]
        out.append(decide.after_capacity_error(sub, errs, world).model_dump(mode="json"))
print(json.dumps(out, sort_keys=True))
"""


def test_a_fresh_process_decides_the_same_under_any_environment(tmp_path: Path) -> None:
    """decide.py used to read the environment at import: a fresh interpreter under an empty
    environment and under one full of settings and AWS credentials must decide the same."""
    empty_home, full_home = tmp_path / "empty", tmp_path / "full"
    empty_home.mkdir()
    (full_home / ".aws").mkdir(parents=True)
    (full_home / ".aws" / "credentials").write_text("[default]\naws_access_key_id = x\n")
    code = _DECIDE_IN_A_FRESH_PROCESS % json.dumps(TASKS)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if os.environ.get("PYTHONPATH"):
        base["PYTHONPATH"] = os.environ["PYTHONPATH"]
    runs = []
    for env in ({**base, "HOME": str(empty_home), "SKYPURZA_HOME": str(empty_home / "spz")},
                {**base, "HOME": str(full_home), "SKYPURZA_HOME": str(full_home / "spz"),
                 "SKYPURZA_MAX_PLACEMENT_ATTEMPTS": "2", "SKYPURZA_ENABLED_INFRAS": "local",
                 "SKYPURZA_LIVE_SPOT_PRICES": "1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                 "AWS_PROFILE": "p", "SKYPURZA_CATALOG": str(tmp_path / "missing.json")}):
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        runs.append(json.loads(res.stdout))
    assert runs[0] == runs[1]
    assert any(d.get("attempt") == 3 for d in runs[0]), "the failover step was not exercised"


def _warm(cat: Catalog) -> None:
    """The catalog's own lazy indexes of its own content, filled (so a snapshot sees them)."""
    list(cat.all_offerings())
    cat.regions
    cat.zone_region("")
    cat.accelerators()
    cat.canonical_accelerator("")


def test_place_leaves_the_catalog_as_it_found_it() -> None:
    _forget_caches()
    cat = codec.loads(codec.dumps(load_catalog()))  # a catalog of its own
    _warm(cat)
    before = copy.deepcopy(vars(cat))
    for reqs in REQUESTS + [[R(zone="use1-az4", use_spot=True)]]:
        for limit in (None, 3):
            place(reqs, 1, cat, [Block("zone", "aws", "us-east-1", "use1-az1")], ("aws",), limit=limit)
    assert vars(cat) == before  # nothing added (no `_floor_prices`, `_regular_zones`), nothing changed
    # A cold catalog too: place() writes no attribute of its own into it.
    cold = codec.loads(codec.dumps(load_catalog()))
    names, fingerprint = set(vars(cold)), cold.fingerprint
    place([R(use_spot=True)], 1, cold, limit=3)
    assert set(vars(cold)) == names and cold.fingerprint == fingerprint


def _submitted(task: dict[str, Any], i: int = 0) -> TaskSubmitted:
    return TaskSubmitted(task_id=f"t{i}", cluster=f"c{i}", task=task)


def test_equal_catalogs_share_a_plan_and_an_index() -> None:
    _forget_caches()
    text = codec.dumps(load_catalog())
    a, b = codec.loads(text), codec.loads(text)
    assert a is not b and a.fingerprint == b.fingerprint
    plan_a = decide.plan_for(_submitted(TASKS[0]), decide.World(a, frozenset({"aws"})))
    plan_b = decide.plan_for(_submitted(TASKS[0]), decide.World(b, frozenset({"aws"})))
    assert plan_b is plan_a and len(decide._PLAN_CACHE) == 1
    assert placement.index_for(a) is placement.index_for(b)
    # Built from parts with equal content: one fingerprint, whichever lookups each has served.
    parts = dict(cloud="aws", built_at="t", source="s", types=[_M6I], offerings=_offerings(100_000))
    c, d = Catalog.from_parts(**parts), Catalog.from_parts(**parts)  # type: ignore[arg-type]
    c.offerings(_M6I.name)
    assert c.fingerprint == d.fingerprint


_M6I = InstanceType("m6i.2xlarge", 8.0, 32.0, None, 0, None, "x86_64")


def _offerings(east_micros: int) -> list[Offering]:
    return [Offering(_M6I.name, "us-east-1", east_micros, (ZoneOffer("use1-az1", None),)),
            Offering(_M6I.name, "us-west-2", 500_000, (ZoneOffer("usw2-az1", None),))]


def _catalog_fields(east_micros: int) -> dict[str, Any]:
    return dict(cloud="aws", built_at="t", source="s", types={_M6I.name: _M6I},
                _offerings={_M6I.name: tuple(_offerings(east_micros))})


def test_a_changed_catalog_at_the_old_address_gets_a_fresh_plan() -> None:
    """The old key was id(catalog): a refreshed catalog allocated where the old one was freed
    had its id and got the old catalog's plan. Constructed so: blank Catalog objects are
    allocated until the allocator hands out the freed address, and that one becomes the new
    catalog (same id, other prices)."""
    _forget_caches()
    task = {"resources": {"instance_type": _M6I.name}, "run": "x"}
    old = Catalog(**_catalog_fields(100_000))  # us-east-1 is the cheapest
    old_id = id(old)
    first = decide.plan_for(_submitted(task), decide.World(old, frozenset({"aws"})))
    assert first.chosen is not None and first.chosen.region == "us-east-1"
    new_fields = _catalog_fields(900_000)  # now us-west-2 is
    placement._INDEXES.clear()  # the only holder of `old` besides this frame
    del old
    gc.collect()
    blanks = []
    for _ in range(1_000_000):
        blank = Catalog.__new__(Catalog)
        if id(blank) == old_id:
            break
        blanks.append(blank)
    else:
        pytest.fail("the freed catalog's address was not handed out again")
    del blanks
    new = blank
    new.__init__(**new_fields)  # type: ignore[misc]
    assert id(new) == old_id
    again = decide.plan_for(_submitted(task), decide.World(new, frozenset({"aws"})))
    assert again.chosen is not None and again.chosen.region == "us-west-2"
    assert len(decide._PLAN_CACHE) == 2


def test_max_attempts_comes_from_the_world_not_the_environment() -> None:
    _forget_caches()
    world = decide.World(load_catalog(), frozenset({"aws"}), max_attempts=2)
    sub = _submitted(TASKS[0])
    first = decide.first_placement(sub, world)
    assert isinstance(first, PlacementChosen)
    errs = [CapacityError(task_id=sub.task_id, cluster=sub.cluster, placement_id="p", attempt=n,
                          candidate=first.candidate, error_class="capacity", code="X", message="m") for n in (1, 2)]
    assert isinstance(decide.after_capacity_error(sub, errs[:1], world), PlacementChosen)
    failed = decide.after_capacity_error(sub, errs, world)
    assert "gave up after 2 attempts" in failed.reason  # type: ignore[union-attr]


def test_enabled_infras_is_a_pure_function_of_what_is_known() -> None:
    assert decide.enabled_infras(None, True) == {"aws"}
    assert decide.enabled_infras(None, False) == {"local"}
    assert decide.enabled_infras(("AWS", " local "), False) == {"aws", "local"}
    assert decide.enabled_infras(None, True, ["aws", "local"]) == {"aws", "local"}
    assert decide.enabled_infras(None, False, ["aws"]) == frozenset()


# ------------------------------------------------------------------------------ the settings base

def test_numbers_at_their_bounds_and_past_them() -> None:
    src = Sources({"LOW": "1", "HIGH": "10", "UNDER": "0.999", "OVER": "10.001", "NAN": "nan", "INF": "inf"}, {})
    assert src.number("LOW", 5, low=1, high=10) == 1.0
    assert src.number("HIGH", 5, low=1, high=10) == 10.0
    for var in ("UNDER", "OVER", "NAN", "INF"):
        with pytest.raises(SettingsError) as e:
            src.number(var, 5, low=1, high=10)
        assert str(e.value) == f"{var}={src.env[var]!r}: expected a number from 1 to 10"
    assert src.number("UNSET", 5, low=1, high=10) == 5  # the default is not checked: it is ours


def test_integers_at_their_bounds_and_past_them() -> None:
    src = Sources({"N": "1024", "M": "1", "BIG": "1025", "ZERO": "0", "FRAC": "8.5", "WORD": "abc"}, {})
    assert src.integer("N", 8, low=1, high=1024) == 1024
    assert src.integer("M", 8, low=1, high=1024) == 1
    for var in ("BIG", "ZERO", "FRAC", "WORD"):
        with pytest.raises(SettingsError, match=rf"^{var}='{src.env[var]}': expected a whole number from 1 to 1024$"):
            src.integer(var, 8, low=1, high=1024)


def test_bad_types_from_the_config_file() -> None:
    where = "/h/.skypurza/config.yaml: a.b"
    assert parse_integer(8.0, where, low=1, high=9) == 8
    assert parse_number(3, where, low=0, high=9) == 3.0
    for bad in (True, [1], {"x": 1}, None, "1e999"):
        with pytest.raises(SettingsError, match="expected a number"):
            parse_number(bad, where, low=0, high=9)
    for bad in (False, 8.5, [8], "eight"):
        with pytest.raises(SettingsError, match="expected a whole number"):
            parse_integer(bad, where, low=1, high=9)
    with pytest.raises(SettingsError, match=r"^/h/.skypurza/config.yaml: a.b='maybe': expected one of 1, true"):
        parse_flag("maybe", where)
    assert parse_flag(True, where) and not parse_flag("Off", where) and parse_flag(" YES ", where)
    assert parse_names("a, b,,c", where) == ("a", "b", "c") and parse_names(["x", " y"], where) == ("x", "y")
    with pytest.raises(SettingsError, match="expected a comma-separated string or a list"):
        parse_names({"a": 1}, where)
    with pytest.raises(SettingsError, match="expected a string"):
        Sources({}, {"url": ["x"]}).text(None, key="url")


def test_environment_then_config_then_default_and_where_it_came_from() -> None:
    cfg = {"svc": {"n": 3, "empty": ""}, "top": 7}
    src = Sources({"N": "4", "EMPTY": ""}, cfg, "/c.yaml")
    assert src.integer("N", 1, low=0, high=9, key="svc.n") == 4  # environment wins
    assert src.integer("EMPTY", 1, low=0, high=9, key="svc.n") == 3  # an empty variable is unset
    assert src.integer(None, 1, low=0, high=9, key="top") == 7
    assert src.integer("NONE", 1, low=0, high=9, key="svc.empty") == 1  # then the default
    assert src.integer("NONE", 1, low=0, high=9, key="top.deeper") == 1  # not a mapping: not there
    with pytest.raises(SettingsError, match=r"^/c.yaml: svc.n=3: expected a whole number from 5 to 9$"):
        src.integer("NONE", 5, low=5, high=9, key="svc.n")
    assert issubclass(SettingsError, ConfigError)  # the CLI and the supervisor report it as one line


# (settings class, variable, low, high, whole number?) -- the ranges docs/provisioner.md,
# docs/managed-jobs.md and docs/optimizer.md give.
RANGES = [
    (ProvisionerSettings, "SKYPURZA_AWS_POLL_S", 0.001, 600, False),
    (ProvisionerSettings, "SKYPURZA_AWS_LAUNCH_TIMEOUT_S", 1, 86400, False),
    (ProvisionerSettings, "SKYPURZA_AWS_RETRY_BASE_S", 0, 600, False),
    (ProvisionerSettings, "SKYPURZA_AWS_MAX_ATTEMPTS", 1, 100, True),
    (ProvisionerSettings, "SKYPURZA_PROVISIONER_CONCURRENCY", 1, 1024, True),
    (ProvisionerSettings, "SKYPURZA_PROVISIONER_ACK_WAIT_S", 1, 86400, False),
    (ProvisionerSettings, "SKYPURZA_PROVISIONER_TRANSIENT_ATTEMPTS", 1, 100, True),
    (ProvisionerSettings, "SKYPURZA_PROVISIONER_TRANSIENT_BACKOFF_S", 0, 3600, False),
    (ProvisionerSettings, "SKYPURZA_RECONCILE_INTERVAL_S", 0, 86400, False),
    (ProvisionerSettings, "SKYPURZA_RECONCILE_GRACE_S", 0, 604800, False),
    (ProvisionerSettings, "SKYPURZA_CLEANUP_INTERVAL_S", 0, 86400, False),
    (ProvisionerSettings, "SKYPURZA_CLEANUP_ATTEMPTS", 1, 100, True),
    (ProvisionerSettings, "SKYPURZA_CLEANUP_BACKOFF_S", 0, 86400, False),
    (ProvisionerSettings, "SKYPURZA_CLEANUP_WAIT_S", 0, 3600, False),
    (RecoverySettings, "SKYPURZA_RECOVERY_EC2_POLL_S", 0, 3600, False),
    (RecoverySettings, "SKYPURZA_RECOVERY_HEARTBEAT_TIMEOUT_S", 0, 86400, False),
    (RecoverySettings, "SKYPURZA_RECOVERY_RECONCILE_S", 0.1, 86400, False),
    (RecoverySettings, "SKYPURZA_RECOVERY_MISSING_POLLS", 1, 100, True),
    (OptimizerSettings, "SKYPURZA_MAX_PLACEMENT_ATTEMPTS", 1, 10000, True),
]


@pytest.mark.parametrize("cls,var,low,high,whole", RANGES, ids=[r[1] for r in RANGES])
def test_every_service_setting_is_bounded(cls: Any, var: str, low: float, high: float, whole: bool) -> None:
    def load(value: str) -> Any:
        return cls.load(env={var: value}, config={})

    def text(x: float) -> str:
        return f"{x:.4f}".rstrip("0").rstrip(".")

    load(text(low)), load(text(high))
    step = 1 if whole else 0.0001
    for past in (low - step, high + step):
        with pytest.raises(SettingsError) as e:
            load(text(past))
        assert str(e.value).startswith(f"{var}='{text(past)}': expected "), e.value
        assert str(e.value).endswith(f" from {low:g} to {high:g}"), e.value
    with pytest.raises(SettingsError, match=rf"^{var}='abc': expected a (whole )?number"):
        load("abc")


def test_defaults_are_unchanged_and_flags_are_strict(tmp_path: Path) -> None:
    assert ProvisionerSettings.load(env={}, config={}) == ProvisionerSettings()
    # the EC2 and Slurm watches are off where no AWS credentials and no ~/.slurm/config exist
    no_slurm = {"SKYPURZA_SLURM_CONFIG": str(tmp_path / "no-slurm-config")}
    assert RecoverySettings.load(env=no_slurm, config={}, aws_files=()) == RecoverySettings(ec2_poll_s=0.0,
                                                                                           slurm_poll_s=0.0)
    (tmp_path / "slurm-config").write_text("Host c1\n  HostName 127.0.0.1\n")
    assert RecoverySettings.load(env={"SKYPURZA_SLURM_CONFIG": str(tmp_path / "slurm-config")}, config={},
                                 aws_files=()).slurm_poll_s == RecoverySettings().slurm_poll_s
    assert RecoverySettings.load(env={"AWS_PROFILE": "p"}, config={}, aws_files=()).ec2_poll_s == 15.0
    assert OptimizerSettings.load(env={}, config={}) == OptimizerSettings()
    assert OptimizerSettings.load(env={"SKYPURZA_ENABLED_INFRAS": "AWS,local"}, config={"allowed_infras": ["AWS"]}
                                  ) == OptimizerSettings(enabled_infras=("aws", "local"), allowed_infras=("aws",))
    assert ProvisionerSettings.load(env={"SKYPURZA_RECONCILE_TERMINATE": "yes"}, config={}).reconcile_terminate
    with pytest.raises(SettingsError, match="^SKYPURZA_RECONCILE_TERMINATE='sometimes': expected one of"):
        ProvisionerSettings.load(env={"SKYPURZA_RECONCILE_TERMINATE": "sometimes"}, config={})
    # config.yaml is the second source (provisioner.*, recovery.*, optimizer.*)
    assert ProvisionerSettings.load(env={}, config={"provisioner": {"concurrency": 3}}).concurrency == 3
    assert RecoverySettings.load(env={}, config={"recovery": {"missing_polls": 4}}, aws_files=()).missing_polls == 4
    assert OptimizerSettings.load(env={}, config={"optimizer": {"live_spot_prices": True}}).live_spot_prices


def test_the_ledger_tick_goes_through_the_same_base() -> None:
    assert parse_ledger_config({}, "c", env={}).tick_s == 60.0
    assert parse_ledger_config({"metering_tick_s": 30}, "c", env={TICK_ENV: "5"}).tick_s == 5.0
    assert parse_ledger_config({}, "c", env={TICK_ENV: "0"}).tick_s == 0.0  # 0: no tick
    with pytest.raises(SettingsError, match=r"^cfg.yaml: metering_tick_s='often': expected a number of seconds"):
        parse_ledger_config({"metering_tick_s": "often"}, "cfg.yaml", env={})
    with pytest.raises(SettingsError, match=rf"^{TICK_ENV}='86401': expected a number of seconds from 0 to 86400$"):
        parse_ledger_config({}, "c", env={TICK_ENV: "86401"})


# The node agent: the environment only (a node has no config.yaml of the user's).
AGENT_RANGES = [
    ("SKYPURZA_AGENT_HEARTBEAT_S", "heartbeat_s", 0.05, 3600),
    ("SKYPURZA_AGENT_KILL_GRACE_S", "kill_grace_s", 0, 3600),
    ("SKYPURZA_CHECKPOINT_SYNC_S", "checkpoint_sync_s", 0.05, 86400),
]


@pytest.mark.parametrize("var,field,low,high", AGENT_RANGES, ids=[r[0] for r in AGENT_RANGES])
def test_agent_settings_are_bounded_and_named(var: str, field: str, low: float, high: float) -> None:
    assert getattr(AgentSettings.load(env={var: f"{low:g}"}), field) == low
    assert getattr(AgentSettings.load(env={var: f"{high:g}"}), field) == high
    for bad in (f"{high * 2:g}", "-1", "abc", "nan"):
        with pytest.raises(SettingsError, match=rf"^{var}='{re.escape(bad)}': expected a number of seconds "
                                                rf"from {low:g} to {high:g}$"):
            AgentSettings.load(env={var: bad})


def test_agent_and_recovery_choices_name_what_they_accept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert AgentSettings.load(env={}) == AgentSettings()  # the defaults of before: 5 s, 10 s, INFO, 30 s
    got = AgentSettings.load(env={"SKYPURZA_AGENT_LOG_LEVEL": "debug", "SKYPURZA_BUCKET_STORE": "S3"})
    assert (got.log_level, got.bucket_store) == ("DEBUG", "s3")
    with pytest.raises(SettingsError, match=r"^SKYPURZA_AGENT_LOG_LEVEL='chatty': expected one of DEBUG, INFO, "
                                            r"WARNING, ERROR, CRITICAL$"):
        AgentSettings.load(env={"SKYPURZA_AGENT_LOG_LEVEL": "chatty"})
    for load in (lambda env: AgentSettings.load(env=env),
                 lambda env: RecoverySettings.load(env=env, config={}, aws_files=())):
        with pytest.raises(SettingsError, match=r"^SKYPURZA_BUCKET_STORE='gcs': expected one of s3, dir$"):
            load({"SKYPURZA_BUCKET_STORE": "gcs"})
    assert RecoverySettings.load(env={"SKYPURZA_BUCKET_STORE": "dir"}, config={}, aws_files=()).bucket_store == "dir"
    # The agent never reads config.yaml: even a broken one changes nothing (the others would refuse it).
    monkeypatch.setenv("SKYPURZA_HOME", str(tmp_path))
    (tmp_path / "config.yaml").write_text("agent: [unclosed\n")
    assert AgentSettings.load(env={}) == AgentSettings()
    with pytest.raises(ConfigError, match="config.yaml:2:1: not valid YAML"):
        OptimizerSettings.load(env={})


def test_a_bad_agent_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path), "SKYPURZA_AGENT_HEARTBEAT_S": "soon"}
    res = subprocess.run([sys.executable, "-m", "skypurza.services.agent", "--nats", "nats://127.0.0.1:1",
                          "--stage", "test", "--cluster", "c", "--rank", "0", "--num-nodes", "1",
                          "--node-ips", "127.0.0.1", "--infra", "local", "--home", str(tmp_path / "n")],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip() == ("spz agent: SKYPURZA_AGENT_HEARTBEAT_S='soon': expected a number of seconds "
                                  "from 0.05 to 3600")


# ------------------------------------------------------------------------------ the config file

def test_the_config_file_is_read_by_the_bounded_loader_with_positions(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"

    def error(text: str) -> str:
        cfg.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_config(cfg)
        return str(e.value)

    cfg.write_text("stage: dev\nprovisioner: {concurrency: 3}\n")
    assert load_config(cfg).data == {"stage": "dev", "provisioner": {"concurrency": 3}}
    cfg.write_text("")
    assert load_config(cfg).data == {}
    assert load_config(tmp_path / "absent.yaml").data == {}
    assert error("stage: dev\nteams: [a, b\n").startswith(f"{cfg}:3:1: not valid YAML: ")
    assert error("stage: dev\nstage: prod\n") == (f"{cfg}:2:1: not valid YAML: duplicate key 'stage' (first given "
                                                    "at line 1); a key may appear once in a mapping")
    assert error("- a\n- b\n") == f"{cfg}: expected a mapping of keys, found list"
    assert error("a: 1\n---\nb: 2\n") == f"{cfg}: expected one YAML document, found 2"
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdef", "bcdefg"))
    assert "too many aliases" in error(laughs)  # refused while reading, not after building 10 million nodes
    cfg.write_bytes(b"stage: \xff\n")
    assert error_of(cfg).startswith(f"{cfg}: not UTF-8 text")
    big = tmp_path / "big.yaml"
    big.write_text("x: " + "y" * (MAX_YAML_FILE_BYTES + 1))
    assert error_of(big) == f"{big}: the file is {MAX_YAML_FILE_BYTES + 4:,} bytes; at most {MAX_YAML_FILE_BYTES:,}"
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert error_of(fifo) == f"{fifo}: not a regular file"  # refused at once: never waits for a writer


def test_a_broken_config_file_is_one_line_from_the_cli(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("stage: dev\nstage: prod\n")
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path)}
    env.pop("SKYPURZA_DEBUG", None)
    res = subprocess.run([sys.executable, "-m", "skypurza.cli.main", "status"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    assert res.stderr.strip() == (f"error: {tmp_path / 'config.yaml'}:2:1: not valid YAML: duplicate key 'stage' "
                                  "(first given at line 1); a key may appear once in a mapping")


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(path)
    return str(e.value)


# ------------------------------------------------------------------------------ AWS is configured

@pytest.mark.parametrize("env,files,expected", [
    ({}, (), False),
    ({"AWS_SECRET_ACCESS_KEY": "s"}, (), False),  # a secret without a key id is not credentials
    ({"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "x"}, (), False),  # a region is not credentials
    ({"AWS_ACCESS_KEY_ID": ""}, (), False),  # empty counts as unset
    *[({k: "v"}, (), True) for k in AWS_ENV_SIGNALS],
    ({}, ("/h/.aws/credentials",), True),
    ({}, ("/h/.aws/config",), True),
])
def test_aws_configured_table(env: dict[str, str], files: tuple[str, ...], expected: bool) -> None:
    assert aws_configured(env, [Path(f) for f in files]) is expected


def test_which_files_count_for_aws() -> None:
    home = Path("/home/u")
    assert aws_config_files({}, home) == (home / ".aws/credentials", home / ".aws/config")
    assert aws_config_files({"HOME": "/other"}, home) == (Path("/other/.aws/credentials"), Path("/other/.aws/config"))
    assert aws_config_files({"AWS_SHARED_CREDENTIALS_FILE": "~/c", "AWS_CONFIG_FILE": "/etc/aws"}, home) == (
        home / "c", Path("/etc/aws"))


def test_recovery_and_buckets_and_the_optimizer_use_the_one_rule(tmp_path: Path) -> None:
    from skypurza.services.agent.storage import store_kind as agent_store_kind
    from skypurza.services.optimizer.world import aws_is_configured
    from skypurza.services.recovery.buckets import store_kind

    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nregion = us-east-1\n")
    env = {"HOME": str(tmp_path)}  # a profile on disk only: once the optimizer's rule, not recovery's
    assert aws_is_configured(env)
    assert RecoverySettings.load(env=env, config={}).ec2_poll_s == 15.0
    assert store_kind(env) == "s3" and agent_store_kind("local", env) == "s3"
    bare = {"HOME": str(tmp_path / "nowhere"), "AWS_ENDPOINT_URL": "http://moto"}  # an endpoint only
    assert aws_is_configured(bare) and store_kind(bare) == "s3" and agent_store_kind("local", bare) == "s3"
    nothing = {"HOME": str(tmp_path / "nowhere")}
    assert not aws_is_configured(nothing)
    assert store_kind(nothing) == "dir" and agent_store_kind("local", nothing) == "dir"
    assert RecoverySettings.load(env=nothing, config={}).ec2_poll_s == 0.0


# ------------------------------------------------------------------------------ at the edge

def test_a_bad_setting_stops_a_services_process_with_one_clear_line(nats_server, tmp_path: Path) -> None:
    env = {**os.environ, "SKYPURZA_HOME": str(tmp_path / "spz"), "SKYPURZA_PROVISIONER_CONCURRENCY": "abc"}
    res = subprocess.run([sys.executable, "-m", "skypurza.cli.serve", "--nats", nats_server.url, "--stage",
                          "badsetting", "--services", "optimizer,provisioner"], env=env, capture_output=True,
                         text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if "SKYPURZA_PROVISIONER_CONCURRENCY" in ln]
    assert len(lines) == 1, out
    assert lines[0].endswith("service provisioner cannot start: SKYPURZA_PROVISIONER_CONCURRENCY='abc': "
                             "expected a whole number from 1 to 1024"), out
    os.environ["SKYPURZA_HOME"], old = str(tmp_path / "spz"), os.environ.get("SKYPURZA_HOME")
    try:
        health = json.loads(naming.services_health_file("badsetting").read_text())
    finally:
        if old is None:
            del os.environ["SKYPURZA_HOME"]
        else:
            os.environ["SKYPURZA_HOME"] = old
    assert health["services"]["provisioner"]["last_error"] == (
        "SettingsError: SKYPURZA_PROVISIONER_CONCURRENCY='abc': expected a whole number from 1 to 1024")
