// Overview: clusters and managed jobs (mine / my team / all for admins), spend now and this period,
// the alerts firing (GET /api/v1/alerts, folded from the log).
import { get, query } from "../api.js";
import { el, heading, link, notice, status, table, usd, when } from "../ui.js";

const REFRESH_MS = 3000;

// The rows a scope shows (pure): the API gives everyone's the caller may read (all_users).
export function scoped(rows, scope, me) {
  if (scope === "mine") return rows.filter((r) => r.user === me.user);
  if (scope === "team") return rows.filter((r) => r.team === me.team);
  return rows;
}

// What the UP clusters cost per hour now (their price is per node).
export function spendNow(clusters) {
  return clusters.filter((c) => c.status === "UP")
    .reduce((sum, c) => sum + Number(c.hourly_price_micros || 0) * Math.max(1, Number(c.num_nodes || 1)), 0);
}

function monthStart() {
  const d = new Date();
  return `${d.getUTCFullYear()}-${String(d.getUTCMonth() + 1).padStart(2, "0")}`;
}

// The address of this page at a past moment (pure): `?at=` before the hash route.
export function travelTo(at, hash) {
  return `?${new URLSearchParams({ at }).toString()}${hash || "#/overview"}`;
}

export async function render(root, { me, signal, at }) {
  const scopes = [["mine", "Mine"], ["team", "My team"]];
  if (me.role === "admin") scopes.push(["all", "All"]);
  const select = el("select", { id: "scope" }, scopes.map(([v, t]) => el("option", { value: v }, t)));
  const cards = el("div", { class: "cards" });
  const msg = el("div");
  const clustersBox = el("div");
  const jobsBox = el("div");
  const alertsBox = el("div");
  const asOf = el("input", { id: "as-of", name: "at", type: "datetime-local", step: "1", value: at ? at.slice(0, 19) : "",
    "aria-describedby": "as-of-help" });
  const travel = el("form", { class: "inline", "aria-label": "Time travel" },
    el("div", {}, el("label", { for: "as-of" }, "As of (UTC)"), asOf),
    el("button", { type: "submit" }, "Show then"),
    el("p", { id: "as-of-help", class: "muted" }, "Any past moment, rebuilt from the log."));
  travel.addEventListener("submit", (e) => {
    e.preventDefault();
    if (asOf.value) location.assign(travelTo(`${asOf.value.length === 16 ? `${asOf.value}:00` : asOf.value}Z`, location.hash));
  });
  root.append(heading("Overview"),
    el("div", { class: "controls" }, el("div", {}, el("label", { for: "scope" }, "Show"), select), travel),
    msg, cards,
    el("section", { "aria-labelledby": "h-alerts" }, el("h2", { id: "h-alerts" }, "Alerts"), alertsBox),
    el("section", { "aria-labelledby": "h-clusters" }, el("h2", { id: "h-clusters" }, "Clusters"), clustersBox),
    el("section", { "aria-labelledby": "h-jobs" }, el("h2", { id: "h-jobs" }, "Managed jobs"), jobsBox));

  let period = null; // this period's spend: read once per page (the ledger's report is not free)
  let shown = "";
  async function refresh() {
    // At a past moment: the clusters rebuilt from the log; managed jobs, alerts and the month's
    // spend are not (yet) rebuilt, and say so.
    const [c, j, a] = await Promise.all([
      get(`/clusters${query({ all_users: "true", at })}`, { signal }),
      at ? { jobs: [], note: "managed jobs are not rebuilt at a past moment yet" }
        : get(`/jobs${query({ all_users: "true" })}`, { signal }),
      at ? { alerts: [], note: "alerts are not rebuilt at a past moment yet" } : get("/alerts", { signal }),
    ]);
    if (at) period = "-";
    if (period === null) {
      const byTeam = await get(`/cost-report${query({ by: "team", since: monthStart() })}`, { signal })
        .catch((e) => (e.name === "AbortError" ? Promise.reject(e) : { error: e }));
      period = byTeam.error ? `unavailable: ${byTeam.error.detail}` : `$${byTeam.total.cost_usd}`;
    }
    const scope = select.value;
    const clusters = scoped(c.clusters, scope, me);
    const jobs = scoped(j.jobs, scope, me);
    const key = JSON.stringify([scope, clusters, jobs, period, a.alerts]);
    if (key === shown) return; // unchanged: the page (and the keyboard focus on it) stays as it is
    shown = key;
    cards.replaceChildren(
      card("Clusters UP", String(clusters.filter((x) => x.status === "UP").length)),
      card(at ? "Spend then" : "Spend now", `${usd(spendNow(clusters))}/h`),
      card(me.role === "admin" ? "This month (all teams)" : `This month (team ${me.team})`, period),
      card("Managed jobs running", String(jobs.filter((x) => x.status === "RUNNING").length)),
      card("Alerts firing", String(a.alerts.length)));
    alertsBox.replaceChildren(table("Alerts firing", [
      ["Severity", (r) => el("span", { class: `severity ${r.severity}` }, r.severity)],
      ["What", (r) => r.summary || r.kind], ["About", (r) => r.subject],
      ["Since", (r) => when(r.raised_at)],
    ], a.alerts, a.note || "no alert is firing"));
    clustersBox.replaceChildren(table("Clusters", [
      ["Name", (r) => link(`#/cluster/${encodeURIComponent(r.name)}`, r.name)],
      ["Status", (r) => status(r.status)],
      ["User", (r) => r.user], ["Team", (r) => r.team],
      ["Where", (r) => [r.infra, r.region].filter(Boolean).join(" / ")],
      ["Resources", (r) => r.instance_type || (r.accelerators ? JSON.stringify(r.accelerators) : "")],
      ["Nodes", (r) => String(r.num_nodes ?? ""), "num"],
      ["$/h", (r) => usd(Number(r.hourly_price_micros || 0) * Math.max(1, Number(r.num_nodes || 1))), "num"],
      ["Cost so far", (r) => (r.cost_usd == null ? "-" : `$${r.cost_usd}`), "num"],
      ["Launched", (r) => when(r.launched_at)],
    ], clusters, "no clusters"));
    jobsBox.replaceChildren(table("Managed jobs", [
      ["ID", (r) => link(`#/job/${r.job_id}`, String(r.job_id))],
      ["Name", (r) => r.name], ["Status", (r) => status(r.status)],
      ["User", (r) => r.user], ["Cluster", (r) => r.cluster ? link(`#/cluster/${encodeURIComponent(r.cluster)}`, r.cluster) : ""],
      ["Recoveries", (r) => String(r.recoveries ?? 0), "num"],
      ["Submitted", (r) => when(r.submitted_at)],
    ], jobs, j.note || "no managed jobs"));
  }

  select.addEventListener("change", () => refresh().catch(fail));
  const fail = (e) => { if (e.name !== "AbortError") notice(msg, "error", e.text || String(e)); };
  await refresh();
  if (at) return; // the past does not change: nothing to refresh
  const timer = setInterval(() => refresh().then(() => notice(msg, "", "")).catch(fail), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}

function card(k, v) {
  return el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v" }, v));
}
