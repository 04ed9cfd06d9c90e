// Cost: showback by team / user / project / cluster (and region, day) over a period, as the ledger
// reports it (GET /api/v1/cost-report, what spz cost-report prints): a table, a bar chart, CSV.
// At a past moment (`at`) it is the ledger's rows up to then: Until is that moment.
import { get, query } from "../api.js";
import { bars } from "../chart.js";
import { csv, download } from "../csv.js";
import { el, heading, notice, table } from "../ui.js";

const BYS = ["team", "user", "project", "cluster", "region", "day"];

export async function render(root, { me, signal, at }) {
  const admin = me.role === "admin";
  const by = el("select", { id: "by", name: "by" }, (admin ? BYS : ["team"]).map((b) => el("option", { value: b }, b)));
  const since = el("input", { id: "since", name: "since", type: "date" });
  const until = el("input", { id: "until", name: "until", type: "date", disabled: Boolean(at),
    title: at ? `the ledger's rows up to ${at}` : null });
  const msg = el("div");
  const out = el("div");
  const exportBtn = el("button", { type: "button", id: "export", disabled: true }, "Export CSV");
  const form = el("form", { class: "inline", "aria-label": "Report" },
    el("div", {}, el("label", { for: "by" }, "Group by"), by),
    el("div", {}, el("label", { for: "since" }, "From"), since),
    el("div", {}, el("label", { for: "until" }, "Until"), until),
    el("button", { type: "submit", class: "primary" }, "Show"), exportBtn);
  root.append(heading("Cost"),
    el("p", { class: "muted" }, admin ? "Every team's usage and compensations, from the ledger."
      : `Your team's (${me.team}) line: other groupings span teams and are for admins.`),
    at ? el("p", { class: "muted", id: "cost-at" }, `As it stood at ${at}: the ledger's rows up to then.`) : "",
    form, msg, out);

  let report = null;
  async function load() {
    notice(msg, "", "");
    const period = at ? { at } : { until: until.value };
    report = await get(`/cost-report${query({ by: by.value, since: since.value, ...period })}`, { signal });
    const lines = report.lines || [];
    out.replaceChildren(
      el("p", {}, "Total: ", el("strong", { id: "total" }, `$${report.total.cost_usd}`),
        el("span", { class: "muted" }, ` (${report.total.billing_minutes} billed minutes; ${report.scope})`)),
      bars(`Cost by ${report.by}`, lines.filter((l) => l.kind === "usage").map((l) => ({
        label: String(l.key ?? "(none)"), value: Number(l.cost_micros), text: `$${l.cost_usd}` }))),
      table(`Cost by ${report.by}`, [
        [report.by, (l) => String(l.key ?? "(none)")], ["Kind", (l) => l.kind],
        ["For period", (l) => l.for_period || ""],
        ["Billed minutes", (l) => String(l.billing_minutes), "num"],
        ["Cost (USD)", (l) => l.cost_usd, "num"],
      ], lines, "no usage in this period"));
    exportBtn.disabled = false;
  }
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    load().catch((err) => { if (err.name !== "AbortError") notice(msg, "error", err.text || String(err)); });
  });
  exportBtn.addEventListener("click", () => {
    if (!report) return;
    const header = [report.by, "kind", "for_period", "cost_usd", "cost_micros", "billing_seconds", "billing_minutes", "rows"];
    download(`cost-by-${report.by}.csv`, csv(header, (report.lines || []).map((l) => [l.key, l.kind, l.for_period,
      l.cost_usd, l.cost_micros, l.billing_seconds, l.billing_minutes, l.rows])));
  });
  await load();
}
