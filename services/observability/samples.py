"""Pure: the metric families of one scrape, from the projections' answers and the log fold.

`Snapshot` holds what the service gathered (each part None when its source did not answer: its
families are left out and `skypurza_metrics_source_up{source}` says 0); `families` turns it into
prometheus-client metric families. No I/O here: tests feed it query answers directly.

Label cardinality is bounded: a label that takes values from users' names (cluster, user, team,
project, region, instance type) keeps at most `max_series` distinct values per family, the
largest first, and folds the rest into "other" (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from skypurza.events.fold import JOB_TERMINAL
from skypurza.events.managed_events import TERMINAL_STATUSES as MANAGED_TERMINAL
from skypurza.events.naming import metric

from .goodput import Goodput
from .logfold import Histogram, LogCounters, histogram_of

OTHER = "other"
UNASSIGNED = "(none)"  # the ledger's name for usage with no team/user/project
# Seconds a job waits from JobQueued to its start: packing on a busy cluster can take hours.
QUEUE_WAIT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400)
LIVE_CLUSTER = ("INIT", "UP")  # clusters whose nodes exist (and are paid for) now
COST_DIMENSIONS = ("team", "user", "project", "cluster")


@dataclass
class Snapshot:
    clusters: list[dict[str, Any]] | None = None  # status(all=True)
    jobs: list[dict[str, Any]] | None = None  # queue()
    managed: list[dict[str, Any]] | None = None  # jobs_queue()
    costs: dict[str, dict[str, Any]] | None = None  # cost_report(by=d) for d in COST_DIMENSIONS
    consumers: list[dict[str, Any]] | None = None  # {consumer, num_pending, num_redelivered, num_ack_pending}
    projections: dict[str, dict[str, Any]] = field(default_factory=dict)  # service -> position()
    last_seq: int | None = None  # the events stream's last sequence
    dead_letters: dict[str, int] | None = None  # service -> parked count
    log: LogCounters | None = None
    sources: dict[str, bool] = field(default_factory=dict)
    # The fast path (what the service asks now): the status service's `metrics_summary` in place
    # of clusters/jobs/managed, the ledger's `spend_summary` in place of costs.
    summary: dict[str, Any] | None = None
    spend: dict[str, Any] | None = None
    goodput: dict[str, dict[str, Goodput]] | None = None  # goodput.report: dim -> key -> Goodput


def _label(value: Any) -> str:
    text = "" if value is None else str(value)
    return text[:128] if text else UNASSIGNED


def bound(values: dict[tuple[str, ...], float], position: int, limit: int) -> dict[tuple[str, ...], float]:
    """Keep at most `limit` distinct values of label `position` (the largest totals first, then by
    name, so the choice is stable) and fold the others into "other"."""
    totals: dict[str, float] = {}
    for key, v in values.items():
        totals[key[position]] = totals.get(key[position], 0.0) + abs(v)
    if len(totals) <= limit:
        return values
    keep = {k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[: max(0, limit - 1)]}
    out: dict[tuple[str, ...], float] = {}
    for key, v in values.items():
        k = key if key[position] in keep else (*key[:position], OTHER, *key[position + 1:])
        out[k] = out.get(k, 0.0) + v
    return out


def _bounded(values: dict[tuple[str, ...], float], positions: Iterable[int], limit: int) -> dict[tuple[str, ...], float]:
    for p in positions:
        values = bound(values, p, limit)
    return values


def _gauge(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(metric(name), doc, labels=labels)
    for key in sorted(values):
        g.add_metric(list(key), values[key])
    return g


def _counter(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> CounterMetricFamily:
    c = CounterMetricFamily(metric(name), doc, labels=labels)
    for key in sorted(values):
        c.add_metric(list(key), values[key])
    return c


def _histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(metric(name), doc, buckets=h.cumulative(), sum_value=h.total)


def _count_by(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for r in rows:
        k = (str(r.get(key) or "UNKNOWN"),)
        out[k] = out.get(k, 0.0) + 1
    return out


def _seconds_between(a: Any, b: Any) -> float | None:
    if not a or not b:
        return None
    try:
        return (datetime.fromisoformat(str(b).replace("Z", "+00:00"))
                - datetime.fromisoformat(str(a).replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return None


def queue_waits(jobs: list[dict[str, Any]]) -> list[float]:
    """Seconds from submission to start, for each job that has started."""
    return [s for s in (_seconds_between(j.get("submitted_at"), j.get("started_at")) for j in jobs) if s is not None]


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def oldest_pending(jobs: list[dict[str, Any]]) -> float | None:
    """Unix time of the oldest submission still PENDING (cluster or managed jobs), None when none."""
    times = [t for t in (_epoch(j.get("submitted_at")) for j in jobs if j.get("status") == "PENDING") if t is not None]
    return min(times) if times else None


def oldest_idle_without_autostop(clusters: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> float | None:
    """Unix time since which the longest-idle UP cluster with no autostop has had no job pending or
    running (its launch or start, or its last job's end), None when there is no such cluster."""
    busy = {j.get("cluster") for j in jobs if j.get("status") not in JOB_TERMINAL}
    last_end: dict[str, float] = {}
    for j in jobs:
        t = _epoch(j.get("ended_at"))
        if t is not None and j.get("cluster"):
            last_end[j["cluster"]] = max(last_end.get(j["cluster"], t), t)
    since = []
    for c in clusters:
        if c.get("status") != "UP" or c.get("autostop_minutes") is not None or c.get("name") in busy:
            continue
        began = [t for t in (_epoch(c.get("launched_at")), _epoch(c.get("started_at")), last_end.get(c.get("name")))
                 if t is not None]
        if began:
            since.append(max(began))
    return min(since) if since else None


def _dollars(micros: int | float) -> float:
    return float(Decimal(int(micros)).scaleb(-6))


def _keyed(rows: list[list[Any]]) -> dict[tuple[str, ...], float]:
    """[[label, ..., value]] rows of a summary as a family's values (labels through `_label`)."""
    out: dict[tuple[str, ...], float] = {}
    for *labels, v in rows:
        k = tuple(_label(x) for x in labels)
        out[k] = out.get(k, 0.0) + float(v or 0)
    return out


def _states(rows: list[list[Any]]) -> dict[tuple[str, ...], float]:
    return {(str(st or "UNKNOWN"),): float(n) for st, n in rows}


def summary_families(m: dict[str, Any], max_series: int) -> list[Metric]:
    """The fleet's families from the status service's `metrics_summary`: the same names, labels
    and values as the ones `families` makes from `status` + `queue` + `jobs_queue` rows."""
    out: list[Metric] = [
        _gauge("clusters", "Clusters by state (terminated ones included).", ["state"], _states(m["clusters_by_state"])),
        _gauge("nodes", "Nodes of clusters that are up or launching.", ["infra", "region", "instance_type", "market"],
               _bounded(_keyed(m["nodes"]), (1, 2), max_series)),
        _gauge("cost_rate_dollars_per_hour", "Dollars per hour being spent now (clusters that are up).",
               ["team", "user", "project", "cluster"],
               _bounded({k: _dollars(v) for k, v in _keyed(m["rate"]).items()}, (3, 1, 2, 0), max_series)),
        _gauge("jobs", "Cluster jobs by state.", ["state"], _states(m["jobs_by_state"])),
    ]
    qw = m["queue_wait"]
    if tuple(float(b) for b in qw["buckets"]) == QUEUE_WAIT_BUCKETS:
        h = Histogram(QUEUE_WAIT_BUCKETS)
        prev = 0
        for i, cum in enumerate([*qw["cumulative"], qw["count"]]):
            h.counts[i], prev = int(cum) - prev, int(cum)
        h.total = float(qw["sum"])
        out.append(_histogram("queue_wait_seconds", "Seconds from a job's submission to its start (jobs that started).", h))
    idle, pend = m.get("oldest_idle_without_autostop"), m.get("oldest_pending")
    out.append(_gauge("oldest_idle_cluster_without_autostop_timestamp_seconds",
                      "Unix time since which the longest-idle UP cluster with no autostop has run nothing "
                      "(absent when none).", [], {} if idle is None else {(): float(idle)}))
    out.append(_gauge("oldest_pending_job_timestamp_seconds", "Unix time of the oldest submission of a job "
                      "(cluster or managed) still PENDING (absent when none).", [], {} if pend is None else {(): float(pend)}))
    total, most = m["managed_recoveries"]
    out.append(_gauge("managed_jobs", "Managed jobs by state.", ["state"], _states(m["managed_by_state"])))
    out.append(_gauge("managed_job_recoveries_max", "The most recoveries of one managed job not finished yet.",
                      [], {(): float(most)}))
    out.append(_counter("managed_job_recoveries", "Recoveries of managed jobs (preemptions and lost nodes).",
                        [], {(): float(total)}))
    return out


SPEND_DIMENSIONS = ("team", "user", "project", "cluster", "job")


def spend_families(spend: dict[str, Any], max_series: int) -> list[Metric]:
    """Dollars spent by each dimension from the ledger's `spend_summary` (its `job` key is bounded
    by the ledger: the newest jobs keep theirs, the rest is `other`) and the GPU-hours paid."""
    out: list[Metric] = []
    by = spend.get("by") or {}
    for dim in SPEND_DIMENSIONS:
        if dim not in by:
            continue
        micros = {(_label(line["key"]),): float(line["cost_micros"]) for line in by[dim]}
        dollars = {k: _dollars(v) for k, v in bound(micros, 0, max_series).items()}
        how = f"`spz cost-report --by {dim}`" if dim != "job" else "the ledger (managed job of the node's cluster)"
        out.append(_counter(f"{dim}_spent_dollars", f"Dollars spent (metered usage and compensations) by {dim}, "
                            f"as {how} says.", [dim], dollars))
    for dim in ("team", "job"):
        if dim in by:
            hours = {(_label(line["key"]),): float(line["gpu_seconds"]) / 3600.0 for line in by[dim]}
            out.append(_counter(f"{dim}_paid_gpu_hours", f"GPU-hours paid for (metered node time x GPUs) by {dim} "
                                "(ledger).", [dim], bound(hours, 0, max_series)))
    return out


def goodput_families(report: dict[str, dict[str, Goodput]], max_series: int) -> list[Metric]:
    """Useful GPU-hours (counters), and over the window since the endpoint started, goodput and
    the idle GPU dollars (gauges), by team and by job. A ratio does not sum, so only the
    `max_series` keys with the most paid GPU time show one; the counters fold into `other`."""
    out: list[Metric] = []
    for dim, keys in report.items():
        useful = {(_label(k),): g.useful_s / 3600.0 for k, g in keys.items() if g.useful_s}
        out.append(_counter(f"{dim}_useful_gpu_hours", f"GPU-hours with utilisation at or above the busy threshold "
                            f"(node samples, since the endpoint started), by {dim}.", [dim], bound(useful, 0, max_series)))
        shown = sorted((k for k, g in keys.items() if g.ratio is not None), key=lambda k: (-keys[k].paid_s, k))[:max_series]
        out.append(_gauge(f"{dim}_goodput_ratio", f"Useful over paid GPU-seconds since the endpoint started, by {dim} "
                          "(paid: the ledger's metered node time x GPUs).", [dim],
                          {(_label(k),): float(keys[k].ratio or 0.0) for k in shown}))
        idle = {(_label(k),): g.idle_dollars for k, g in keys.items() if g.ratio is not None}
        out.append(_gauge(f"{dim}_idle_gpu_dollars", f"Dollars of GPU nodes paid since the endpoint started for GPU "
                          f"time that did no useful work (cost x (1 - goodput)), by {dim}.", [dim],
                          bound(idle, 0, max_series)))
    return out


@dataclass(frozen=True)
class Segment:
    """A run of a page's families built from one input. `key` is that input (a projection's
    summary answer): equal keys build equal families, so the service may reuse the run's encoded
    text when the answer is the same as at the last scrape (render.py). None: built every time."""

    name: str
    key: Any
    build: Callable[[], list[Metric]]


def segments(s: Snapshot, max_series: int) -> list[Segment]:
    """The page's families in order, in runs: the two summaries (most of the page, and the same
    answer as long as nothing moved in their projection), then everything else."""
    out: list[Segment] = []
    if s.summary is not None:
        summary = s.summary
        out.append(Segment("summary", (max_series, summary), lambda: summary_families(summary, max_series)))
    if s.spend is not None:
        spend = s.spend
        out.append(Segment("spend", (max_series, spend), lambda: spend_families(spend, max_series)))
    out.append(Segment("rest", None, lambda: _rest_families(s, max_series)))
    return out


def families(s: Snapshot, max_series: int) -> list[Metric]:
    return [f for seg in segments(s, max_series) for f in seg.build()]


def _rest_families(s: Snapshot, max_series: int) -> list[Metric]:
    out: list[Metric] = []
    if s.goodput is not None:
        out += goodput_families(s.goodput, max_series)
    if s.clusters is not None:
        out.append(_gauge("clusters", "Clusters by state (terminated ones included).", ["state"],
                          _count_by(s.clusters, "status")))
        nodes: dict[tuple[str, ...], float] = {}
        rate: dict[tuple[str, ...], float] = {}
        for c in s.clusters:
            if c.get("status") not in LIVE_CLUSTER:
                continue
            n = int(c.get("num_nodes") or 0)
            k = (_label(c.get("infra")), _label(c.get("region")), _label(c.get("instance_type")), _label(c.get("market")))
            nodes[k] = nodes.get(k, 0.0) + n
            if c.get("status") == "UP":
                rk = (_label(c.get("team")), _label(c.get("user")), _label(c.get("project")), _label(c.get("name")))
                rate[rk] = rate.get(rk, 0.0) + _dollars(int(c.get("hourly_price_micros") or 0) * n)
        out.append(_gauge("nodes", "Nodes of clusters that are up or launching.",
                          ["infra", "region", "instance_type", "market"], _bounded(nodes, (1, 2), max_series)))
        out.append(_gauge("cost_rate_dollars_per_hour", "Dollars per hour being spent now (clusters that are up).",
                          ["team", "user", "project", "cluster"], _bounded(rate, (3, 1, 2, 0), max_series)))
    if s.jobs is not None:
        out.append(_gauge("jobs", "Cluster jobs by state.", ["state"], _count_by(s.jobs, "status")))
        out.append(_histogram("queue_wait_seconds", "Seconds from a job's submission to its start (jobs that started).",
                              histogram_of(queue_waits(s.jobs), QUEUE_WAIT_BUCKETS)))
    if s.clusters is not None and s.jobs is not None:
        idle = oldest_idle_without_autostop(s.clusters, s.jobs)
        out.append(_gauge("oldest_idle_cluster_without_autostop_timestamp_seconds",
                          "Unix time since which the longest-idle UP cluster with no autostop has run nothing "
                          "(absent when none).", [], {} if idle is None else {(): idle}))
    if s.jobs is not None or s.managed is not None:
        pend = oldest_pending((s.jobs or []) + (s.managed or []))
        out.append(_gauge("oldest_pending_job_timestamp_seconds", "Unix time of the oldest submission of a job "
                          "(cluster or managed) still PENDING (absent when none).", [],
                          {} if pend is None else {(): pend}))
    if s.managed is not None:
        out.append(_gauge("managed_jobs", "Managed jobs by state.", ["state"], _count_by(s.managed, "status")))
        live = [int(m.get("recoveries") or 0) for m in s.managed if m.get("status") not in MANAGED_TERMINAL]
        out.append(_gauge("managed_job_recoveries_max", "The most recoveries of one managed job not finished yet.",
                          [], {(): float(max(live, default=0))}))
        out.append(_counter("managed_job_recoveries", "Recoveries of managed jobs (preemptions and lost nodes).",
                            [], {(): float(sum(int(m.get("recoveries") or 0) for m in s.managed))}))
    if s.costs is not None:
        for dim in COST_DIMENSIONS:
            report = s.costs.get(dim)
            if report is None:
                continue
            spent: dict[tuple[str, ...], float] = {}
            for line in report.get("lines", []):
                k = (_label(line.get("key")),)
                spent[k] = spent.get(k, 0.0) + int(line.get("cost_micros") or 0)
            spent = {k: _dollars(v) for k, v in bound(spent, 0, max_series).items()}
            out.append(_counter(f"{dim}_spent_dollars", f"Dollars spent (metered usage and compensations) by {dim}, "
                                "as `spz cost-report --by " + dim + "` says.", [dim], spent))
    if s.log is not None:
        lg = s.log
        out.append(_counter("placement_attempts", "Placements chosen: a task's first choice, or a failover after a "
                            "capacity error.", ["kind"], {(k,): float(v) for k, v in lg.placements.items()}))
        out.append(_counter("failovers", "Capacity errors that made the optimizer fail over, by error class.",
                            ["reason"], {(k,): float(v) for k, v in lg.failovers.items()}))
        out.append(_counter("placement_failures", "Tasks no place could take (PlacementFailed).", [],
                            {(): float(lg.placement_failures)}))
        out.append(_counter("preemptions", "Spot preemptions detected.", [], {(): float(lg.preemptions)}))
        gpu = {(k,): v / 3600.0 for k, v in lg.gpu_seconds.items()}
        out.append(_counter("gpu_hours", "GPU-hours metered by the ledger (usage intervals x GPUs per node), by team.",
                            ["team"], bound(gpu, 0, max_series)))
        out.append(_histogram("provisioning_seconds", "Seconds from a task's submission to its cluster provisioned.",
                              lg.provisioning))
        out.append(_counter("gpu_unhealthy_findings", "GPU health findings (GpuUnhealthy) by severity and rule.",
                            ["severity", "rule"], {k: float(v) for k, v in lg.gpu_findings.items()}))
        out.append(_counter("orphans_found", "Nodes reconciliation found running for no live cluster, by action "
                            "(reported, then terminated).", ["action"], {(k,): float(v) for k, v in lg.orphans.items()}))
        held: dict[tuple[str, ...], float] = {}
        for kind, _ in lg.held.values():
            held[(kind,)] = held.get((kind,), 0.0) + 1
        out.append(_gauge("dispatch_pending_tasks", "Tasks the dispatch policy holds now, by the kind of reason "
                          "(quota, user_limit, budget, order, no_queue, no_flavor, policy).", ["reason"], held))
        out.append(_counter("log_events_read", "Events this endpoint has folded from the log.", [],
                            {(): float(lg.events)}))
    if s.consumers is not None:
        pend = {(c["consumer"],): float(c.get("num_pending") or 0) for c in s.consumers}
        redl = {(c["consumer"],): float(c.get("num_redelivered") or 0) for c in s.consumers}
        ackp = {(c["consumer"],): float(c.get("num_ack_pending") or 0) for c in s.consumers}
        out.append(_gauge("consumer_pending_messages", "Events a service's durable consumer has yet to receive.",
                          ["consumer"], bound(pend, 0, max_series)))
        out.append(_gauge("consumer_redelivered_messages", "Events redelivered to a durable consumer, not yet acked.",
                          ["consumer"], bound(redl, 0, max_series)))
        out.append(_gauge("consumer_ack_pending_messages", "Events delivered to a durable consumer, not yet acked.",
                          ["consumer"], bound(ackp, 0, max_series)))
    if s.projections and s.last_seq is not None:
        lag = {(svc,): float(max(0, s.last_seq - int(p.get("checkpoint") or 0))) for svc, p in s.projections.items()}
        out.append(_gauge("projection_lag_events", "Events in the log a projection has not committed yet.",
                          ["service"], lag))
    if s.dead_letters is not None:
        out.append(_gauge("dead_letters", "Events parked on the dead-letter stream, by the service that parked them.",
                          ["service"], bound({(k,): float(v) for k, v in s.dead_letters.items()}, 0, max_series)))
    out.append(_gauge("metrics_source_up", "1 when the source answered this scrape, 0 when it did not.", ["source"],
                      {(k,): 1.0 if v else 0.0 for k, v in s.sources.items()}))
    return out
