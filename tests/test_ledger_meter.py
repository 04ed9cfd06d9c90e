"""The meter (pure): intervals due from the projected node runs, deterministic ids, no double
counting across restarts or repeated events; and the ledger's config."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from ledger_history import History, cand

from skypurza.events.config import ConfigError
from skypurza.events.envelope import make_envelope
from skypurza.events.models import ClusterProvisioned, ClusterStopped, ClusterTerminated
from skypurza.events.types import NodeInfo
from skypurza.events.projection.records import decode_record
from skypurza.services.ledger.ledgerconfig import LedgerConfig, parse_ledger_config
from skypurza.services.ledger.meter import due_usage
from skypurza.services.ledger.projector import State, apply

T0 = datetime(2026, 10, 30, 23, 58, 30, 250_000, tzinfo=UTC)
TICK = timedelta(minutes=1)
PRICE = 98_320_000  # an H100 node, $98.32/h


class Log:
    """An in-memory log + projection: what the ledger sees, without a server."""

    def __init__(self) -> None:
        self.state = State()
        self.seq = 0
        self.usage: list = []

    def append(self, payload: bytes) -> None:
        self.seq += 1
        self.state.start_batch()
        apply(self.state, decode_record(payload, self.seq))

    def event(self, env) -> None:  # noqa: ANN001
        self.append(env.to_json())

    def meter(self, now: datetime, overlay: dict | None = None, apply_them: bool = True) -> list:
        out = due_usage(self.state, now, TICK, CFG, {} if overlay is None else overlay)
        if apply_them:
            for eid, ev in out:
                self.append(make_envelope(ev, source="/t", id=eid).to_json())
                self.usage.append((eid, ev))
        return out


CFG = LedgerConfig()


def provisioned(log: Log, h: History, nodes: int = 2):
    env = h.add(ClusterProvisioned(cluster="c", task_id="t", placement_id="p", candidate=cand(num_nodes=nodes),
                                   nodes=[NodeInfo(rank=r, instance_id=f"i-{r}") for r in range(nodes)],
                                   hourly_price_micros=PRICE, launched_at=T0, user="u", team="ml",
                                   tres={"cpu": 8, "mem": 32768, "node": 1, "gres/gpu": 1}))
    log.event(env)
    return env


def test_intervals_tile_the_run_and_cost_telescopes():
    log, h = Log(), History()
    provisioned(log, h, nodes=1)
    stop = T0 + timedelta(minutes=3, seconds=44, microseconds=750_000)  # 00:02:15
    log.meter(T0 + timedelta(minutes=2))
    log.event(h.add(ClusterStopped(cluster="c", stopped_at=stop)))
    log.meter(T0 + timedelta(hours=1))
    spans = [(e.start, e.end, e.final) for _, e in log.usage]
    assert spans[0][0] == T0 and spans[-1][1] == stop and spans[-1][2]
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert sum(e.cost_micros for _, e in log.usage) == PRICE * ((stop - T0) // timedelta(microseconds=1)) // 3_600_000_000
    assert not log.meter(T0 + timedelta(days=3))  # finalized: nothing more, ever


def test_a_restarted_meter_emits_exactly_what_an_uninterrupted_one_does():
    end = T0 + timedelta(minutes=30)
    straight, h1 = Log(), History()
    provisioned(straight, h1)
    straight.meter(end)

    restarted, h2 = Log(), History()
    provisioned(restarted, h2)
    overlay: dict = {}
    restarted.meter(T0 + timedelta(minutes=7), overlay)
    # Published but not yet projected: the overlay stops a second pass from repeating them.
    pending = restarted.meter(T0 + timedelta(minutes=12), overlay, apply_them=False)
    assert pending and not restarted.meter(T0 + timedelta(minutes=12), overlay, apply_them=False)
    # The process dies before the projection read them; a new one starts from the log alone.
    restarted.meter(end, {})
    assert sorted(restarted.usage, key=lambda u: u[0]) == sorted(straight.usage, key=lambda u: u[0])


def test_a_repeated_usage_event_counts_once():
    log, h = Log(), History()
    provisioned(log, h, nodes=1)
    log.meter(T0 + timedelta(minutes=5))
    n = log.state.last_seq
    # Every interval stored a second time (a late re-publish): none is applied again.
    for eid, ev in list(log.usage):
        log.append(make_envelope(ev, source="/t", id=eid).to_json())
    log.state.start_batch()
    log.meter(T0 + timedelta(minutes=5))
    assert log.state.last_seq == n + len(log.usage)
    key = next(iter(log.state.rows["meters"]))
    assert log.state.rows["meters"][key]["metered_until"] == datetime(2026, 10, 31, 0, 3, tzinfo=UTC)


def test_a_stop_known_late_is_taken_back_once():
    log, h = Log(), History()
    provisioned(log, h, nodes=1)
    log.meter(T0 + timedelta(minutes=10))
    stop = T0 + timedelta(minutes=4, seconds=1)
    log.event(h.add(ClusterTerminated(cluster="c", terminated_at=stop)))
    out = log.meter(T0 + timedelta(minutes=20))
    assert len(out) == 1 and out[0][1].correction and out[0][1].cost_micros < 0 and out[0][1].billing_seconds < 0
    total = sum(e.cost_micros for _, e in log.usage)
    assert total == PRICE * ((stop - T0) // timedelta(microseconds=1)) // 3_600_000_000
    bill = sum(e.billing_seconds for _, e in log.usage)
    assert bill == 8 * ((stop - T0) // timedelta(microseconds=1)) // 1_000_000  # no weights: billing = CPUs
    assert not log.meter(T0 + timedelta(hours=2))


def test_ids_are_derived_from_the_run_rank_and_start():
    a, ha = Log(), History()
    b, hb = Log(), History()
    env_a = provisioned(a, ha)
    env_b = provisioned(b, hb)
    assert env_a.id == env_b.id
    ids_a = [eid for eid, _ in a.meter(T0 + timedelta(minutes=3))]
    ids_b = [eid for eid, _ in b.meter(T0 + timedelta(minutes=3))]
    assert ids_a == ids_b and len(set(ids_a)) == len(ids_a) == 2 * 3  # [23:58:30.25, 23:59), [23:59, 0:00), [0:00, 0:01)


def test_team_weights_and_attribution_from_config():
    cfg = parse_ledger_config({
        "billing": {"weights": {"default": "CPU=1.0", "teams": {"ml": "CPU=0.5,GRES/gpu=10"}},
                    "flags": "MAX_TRES"},
        "teams": {"bob": "ops"}, "team": "everyone", "metering_tick_s": 30,
    }, "cfg.yaml")
    assert cfg.tick_s == 30 and cfg.team_of("bob") == "ops" and cfg.team_of("zoe") == "everyone"
    tres = {"cpu": 8, "mem": 32768, "node": 1, "gres/gpu": 1}
    assert cfg.billing_int("ml", tres, "k1") == 10  # MAX(8 × 0.5, 1 × 10)
    assert cfg.billing_int("ops", tres, "k2") == 8
    with pytest.raises(ConfigError, match="cfg.yaml: billing"):
        parse_ledger_config({"billing": {"weights": "CPU=lots"}}, "cfg.yaml")
    with pytest.raises(ConfigError, match="metering_tick_s"):
        parse_ledger_config({"metering_tick_s": "often"}, "cfg.yaml")
