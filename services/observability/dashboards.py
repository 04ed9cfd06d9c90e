"""Grafana dashboards over the `/metrics` families, built in Python (pure: no I/O, no Grafana
library): spend, goodput, and the fleet (GPU health, placements and failovers, bus lag).

`dashboards()` is the catalogue; `grafana_json(d)` is Grafana's dashboard JSON model for one
(a `datasource` variable of type prometheus, so an import asks which Prometheus to use).
Each target says whether a control plane running any job must give it data (`expect_data`):
the suite runs every target's query against a real Prometheus scraping a real control plane and
fails on a query error, or on an empty answer from a target that expects data. `spz observability
dashboards -o DIR` writes the files (docs/observability.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from skypurza.events.naming import dashboard_uid, metric

SCHEMA_VERSION = 39  # Grafana 10/11's dashboard model
GRID_W = 24


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    # A control plane that ran one job on the local infra has data for it (no GPUs, no failures).
    expect_data: bool = True


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # timeseries | stat | bargauge | table
    unit: str = "short"  # Grafana's unit ids: currencyUSD, percentunit, s, h, short
    description: str = ""
    width: int = 12
    height: int = 8


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("skypurza",))

    @property
    def file_name(self) -> str:
        return f"{self.uid}.json"


def m(name: str) -> str:
    """A family's full name (the naming module's prefix)."""
    return metric(name)


def _spend() -> Dashboard:
    rate, team, user, job = m("cost_rate_dollars_per_hour"), m("team_spent_dollars_total"), \
        m("user_spent_dollars_total"), m("job_spent_dollars_total")
    return Dashboard(dashboard_uid("spend"), "SkyPurza: spend", "Dollars per hour now and dollars spent, by team, user and "
                     "job, from the ledger's numbers (metered usage and compensations).", (
        Panel("$/h now", (Target(f"sum({rate})", "total"),), kind="stat", unit="currencyUSD", width=6,
              description="Price per node x nodes of every cluster that is UP."),
        Panel("$/h now by team", (Target(f"sum by (team) ({rate})", "{{team}}"),), unit="currencyUSD", width=9),
        Panel("$/h now by user", (Target(f"sum by (user) ({rate})", "{{user}}"),), unit="currencyUSD", width=9),
        Panel("Spent by team (since the log began)", (Target(f"sum by (team) ({team})", "{{team}}"),),
              kind="bargauge", unit="currencyUSD", description="Equals `spz cost-report --by team`."),
        Panel("Spent by user (since the log began)", (Target(f"sum by (user) ({user})", "{{user}}"),),
              kind="bargauge", unit="currencyUSD"),
        Panel("Spend over time by team ($ per hour)", (Target(f"sum by (team) (rate({team}[5m])) * 3600", "{{team}}"),),
              unit="currencyUSD", description="How fast each team's spend counter grows."),
        Panel("Spend over time by user ($ per hour)", (Target(f"sum by (user) (rate({user}[5m])) * 3600", "{{user}}"),),
              unit="currencyUSD"),
        Panel("Top jobs by spend", (Target(f"topk(10, sum by (job) ({job}))", "job {{job}}"),), kind="table",
              unit="currencyUSD", description="Managed jobs (`(none)`: clusters no managed job launched; "
                                                 "`other`: the older jobs past the label bound)."),
        Panel("GPU-hours paid by team", (Target(f"sum by (team) ({m('team_paid_gpu_hours_total')})", "{{team}}"),),
              unit="h"),
    ))


def _goodput() -> Dashboard:
    return Dashboard(dashboard_uid("goodput"), "SkyPurza: goodput", "Useful GPU time (utilisation at or above the busy "
                     "threshold, from node samples) over the GPU time paid for (the ledger's metered node time), "
                     "and what the idle part cost.", (
        Panel("Goodput by team", (Target(f"{m('team_goodput_ratio')}", "{{team}}", expect_data=False),),
              unit="percentunit", description="Since the endpoint started; absent where no GPU time was paid."),
        Panel("Goodput by job", (Target(f"{m('job_goodput_ratio')}", "job {{job}}", expect_data=False),),
              unit="percentunit"),
        Panel("Idle GPU dollars by team", (Target(f"{m('team_idle_gpu_dollars')}", "{{team}}", expect_data=False),),
              kind="bargauge", unit="currencyUSD"),
        Panel("Idle GPU dollars by job", (Target(f"topk(10, {m('job_idle_gpu_dollars')})", "job {{job}}",
                                                 expect_data=False),), kind="table", unit="currencyUSD"),
        Panel("Useful vs paid GPU-hours per hour, by team", (
            Target(f"sum by (team) (rate({m('team_useful_gpu_hours_total')}[5m])) * 3600", "useful {{team}}",
                   expect_data=False),
            Target(f"sum by (team) (rate({m('team_paid_gpu_hours_total')}[5m])) * 3600", "paid {{team}}")),
              unit="h", width=24),
    ))


def _fleet() -> Dashboard:
    findings = m("gpu_unhealthy_findings_total")
    return Dashboard(dashboard_uid("fleet"), "SkyPurza: fleet", "Clusters, jobs and nodes; GPU health; placements and "
                     "failovers; the bus's lag.", (
        Panel("Clusters by state", (Target(f"sum by (state) ({m('clusters')})", "{{state}}"),), width=8),
        Panel("Jobs by state", (Target(f"sum by (state) ({m('jobs')})", "{{state}}"),), width=8),
        Panel("Nodes by infra and instance type", (Target(f"sum by (infra, instance_type) ({m('nodes')})",
                                                          "{{infra}} {{instance_type}}"),), width=8),
        Panel("GPU health findings (last hour)", (Target(f"sum by (severity, rule) (increase({findings}[1h]))",
                                                         "{{severity}} {{rule}}", expect_data=False),),
              kind="bargauge", description="GpuUnhealthy by rule: Xid, ECC, missing GPU, idle, thermal."),
        Panel("GPU-hours metered by team", (Target(f"sum by (team) ({m('gpu_hours_total')})", "{{team}}",
                                                   expect_data=False),), unit="h"),
        Panel("Placements per hour by kind", (Target(f"sum by (kind) (rate({m('placement_attempts_total')}[5m])) * 3600",
                                                     "{{kind}}"),)),
        Panel("Failovers per hour by reason", (Target(f"sum by (reason) (rate({m('failovers_total')}[5m])) * 3600",
                                                      "{{reason}}", expect_data=False),)),
        Panel("Preemptions and placement failures (last hour)", (
            Target(f"increase({m('preemptions_total')}[1h])", "preemptions"),
            Target(f"increase({m('placement_failures_total')}[1h])", "no place")), kind="stat"),
        Panel("Provisioning p90", (Target(f"histogram_quantile(0.9, sum by (le) (rate({m('provisioning_seconds_bucket')}[1h])))",
                                          "p90"),), unit="s"),
        Panel("Queue wait p90", (Target(f"histogram_quantile(0.9, sum by (le) (rate({m('queue_wait_seconds_bucket')}[1h])))",
                                        "p90"),), unit="s"),
        Panel("Bus lag: pending per consumer", (Target(f"max by (consumer) ({m('consumer_pending_messages')})",
                                                       "{{consumer}}"),)),
        Panel("Bus lag: projections behind the log", (Target(f"max by (service) ({m('projection_lag_events')})",
                                                             "{{service}}"),)),
        Panel("Dead letters by service", (Target(f"sum by (service) ({m('dead_letters')})", "{{service}}",
                                                 expect_data=False),), kind="bargauge"),
        Panel("Metrics sources up", (Target(f"min by (source) ({m('metrics_source_up')})", "{{source}}"),),
              kind="stat"),
    ))


def dashboards() -> list[Dashboard]:
    return [_spend(), _goodput(), _fleet()]


def _layout(panels: tuple[Panel, ...]) -> list[dict[str, int]]:
    """Left to right, then down: each panel's grid position."""
    out, x, y, row_h = [], 0, 0, 0
    for p in panels:
        w = min(p.width, GRID_W)
        if x + w > GRID_W:
            x, y, row_h = 0, y + row_h, 0
        out.append({"x": x, "y": y, "w": w, "h": p.height})
        x, row_h = x + w, max(row_h, p.height)
    return out


def grafana_json(d: Dashboard) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for i, (p, pos) in enumerate(zip(d.panels, _layout(d.panels)), start=1):
        panels.append({
            "id": i, "type": p.kind, "title": p.title, "description": p.description, "gridPos": pos,
            "datasource": ds,
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}} if p.kind == "timeseries" else {},
            "targets": [{"refId": chr(ord("A") + j), "datasource": ds, "expr": t.expr, "legendFormat": t.legend,
                         "instant": p.kind in ("stat", "bargauge", "table"), "range": p.kind == "timeseries"}
                        for j, t in enumerate(p.targets)],
        })
    return {
        "uid": d.uid, "title": d.title, "description": d.description, "tags": list(d.tags),
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "timezone": "utc",
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                                 "query": "prometheus", "current": {}, "hide": 0}]},
        "annotations": {"list": []}, "panels": panels,
    }


def targets(ds: list[Dashboard] | None = None) -> list[tuple[str, str, Target]]:
    """(dashboard uid, panel title, target) for every query of every dashboard."""
    return [(d.uid, p.title, t) for d in (ds or dashboards()) for p in d.panels for t in p.targets]
