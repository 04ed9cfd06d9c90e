// Dispatch: each queue's quota used against nominal, the tasks waiting with why, the budgets, and
// the policy (GET/PUT /api/v1/dispatch/policy). Admins edit the policy YAML here; what the
// server's validator finds is listed at its line, and "Go to line" puts the cursor there.
// A change is an event like any other (DispatchPolicyApplied, stamped with the admin).
// Each waiting task shows its priority and the weighted factors it is made of (`spz dispatch
// prio`); the fairshare tree is `spz dispatch share` (GET /api/v1/dispatch/share).
import { get, put } from "../api.js";
import { el, heading, notice, table } from "../ui.js";

const REFRESH_MS = 3000;

// "2/4" with a bar a screen reader reads as a value (pure).
export function meter(used, nominal) {
  const max = Math.max(Number(nominal) || 0, Number(used) || 0, 1e-9);
  return el("span", { class: "meter" },
    el("meter", { min: "0", max: String(max), value: String(used), "aria-label": `${used} of ${nominal} in use` }),
    ` ${fmt(used)} / ${fmt(nominal)}`);
}

const fmt = (n) => (Number.isInteger(Number(n)) ? String(n) : Number(n).toFixed(2));
const dec = (n) => (n === null || n === undefined ? "" : Number(n).toFixed(3).replace(/\.?0+$/, "") || "0");
// "age 120, fairshare 500 …": the weighted factors a task's priority sums (zeros left out).
const factors = (r) => Object.entries({ ...(r.factors || {}), ...Object.fromEntries(Object.entries(r.tres || {})
  .map(([k, v]) => [`tres/${k}`, v])) }).filter(([, v]) => Number(v) !== 0)
  .map(([k, v]) => `${k} ${fmt(v)}`).concat(r.nice ? [`nice ${r.nice}`] : []).join(", ") || "-";
const request = (r) => Object.entries(r || {}).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");

// The offset in `text` where line `line` (1-based) starts and ends (pure).
export function lineSpan(text, line) {
  const lines = text.split("\n");
  if (!(line >= 1 && line <= lines.length)) return [text.length, text.length];
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  return [start, start + lines[line - 1].length];
}

export async function render(root, { me, signal }) {
  const admin = me.role === "admin";
  const msg = el("div");
  const queuesBox = el("div");
  const pendingBox = el("div");
  const budgetsBox = el("div");
  const shareBox = el("div");
  const policyBox = el("div");
  const problemsBox = el("div", { id: "policy-problems" });
  root.append(heading("Dispatch"), msg,
    el("section", { "aria-labelledby": "h-queues" }, el("h2", { id: "h-queues" }, "Queues: quota in use"), queuesBox),
    el("section", { "aria-labelledby": "h-pending" }, el("h2", { id: "h-pending" }, "Waiting for admission"), pendingBox),
    el("section", { "aria-labelledby": "h-share" }, el("h2", { id: "h-share" }, "Fairshare tree"),
      el("p", { class: "muted" }, "Each team's and user's shares and decayed usage, and the FairShare factor their "
        + "tasks' priority is weighted by (higher: more owed)."), shareBox),
    el("section", { "aria-labelledby": "h-budgets" }, el("h2", { id: "h-budgets" }, "Budgets"), budgetsBox),
    el("section", { "aria-labelledby": "h-policy" }, el("h2", { id: "h-policy" }, admin ? "Policy: quotas and budgets"
      : "Policy"), policyBox, problemsBox));
  const say = (e) => { if (e.name !== "AbortError") notice(msg, "error", e.text || String(e)); };

  let shown = "";
  async function refresh() {
    const [q, b, sh] = await Promise.all([get("/dispatch/queue", { signal }), get("/budgets", { signal }),
      // an older dispatch gives no tree: the rest of the page still shows
      get("/dispatch/share", { signal }).catch((e) => { if (e.name === "AbortError") throw e; return { error: e }; })]);
    const key = JSON.stringify([q, b, sh]);
    if (key === shown) return;
    shown = key;
    const rows = q.queues.flatMap((x) => (x.quotas.length ? x.quotas : [{}]).map((r) => ({ ...r, queue: x })));
    queuesBox.replaceChildren(q.policy ? table("Queues", [
      ["Queue", (r) => r.queue.name], ["Team", (r) => r.queue.team], ["Cohort", (r) => r.queue.cohort || ""],
      ["Strategy", (r) => r.queue.strategy], ["Flavor", (r) => r.flavor || ""], ["Resource", (r) => r.resource || ""],
      ["In use / nominal", (r) => (r.resource ? meter(r.used, r.nominal) : "no quota")],
      ["Borrowing limit", (r) => (r.borrowing_limit ?? "none"), "num"],
      ["Lending limit", (r) => (r.lending_limit ?? "none"), "num"],
    ], rows, "no queues") : el("p", { class: "muted" }, "No dispatch policy: every submission is admitted at once."));
    pendingBox.replaceChildren(table("Tasks waiting for admission", [
      ["#", (r) => String(r.position), "num"], ["Cluster", (r) => r.cluster], ["Team", (r) => r.team || ""],
      ["User", (r) => r.user], ["Asks", (r) => request(r.request)], ["Priority", (r) => String(r.priority), "num"],
      ["Factors", (r) => factors(r)], ["Held for", (r) => r.kind || ""], ["Reason", (r) => r.reason],
    ], q.pending, "no task waits"));
    shareBox.replaceChildren(sh.error ? el("p", { class: "muted" }, sh.error.text || String(sh.error)) : table(`Fairshare tree (${sh.algorithm})`, [
      ["Account", (r) => (r.user ? `  ${r.account}` : r.account)], ["User", (r) => r.user || ""],
      ["Raw shares", (r) => String(r.raw_shares), "num"], ["Norm shares", (r) => dec(r.norm_shares), "num"],
      ["Raw usage", (r) => dec(r.raw_usage), "num"], ["Effective usage", (r) => dec(r.effectv_usage), "num"],
      ["FairShare", (r) => (r.fairshare === null || r.fairshare === undefined ? "" : dec(r.fairshare)), "num"],
    ], sh.rows, "no team or user yet"));
    budgetsBox.replaceChildren(table("Budgets", [
      ["Who", (r) => r.team + (r.user ? `/${r.user}` : "")], ["Period", (r) => r.period_key],
      ["Spent / limit", (r) => meter(r.spent_usd, r.limit_usd)],
      ["State", (r) => r.state + (r.hard ? " (hard)" : "")],
      ["Runs out", (r) => r.runs_out_at || ""],
    ], b.budgets, "no budgets"));
  }

  async function showPolicy() {
    const p = await get("/dispatch/policy", { signal });
    const by = p.applied_by ? `Applied by ${p.applied_by}${p.source ? ` from ${p.source}` : ""} (log sequence ${p.seq}).`
      : "No policy applied yet.";
    if (!admin) {
      policyBox.replaceChildren(el("p", { class: "muted" }, by),
        p.yaml ? el("pre", { class: "yaml", tabindex: "0", "aria-label": "The dispatch policy" }, p.yaml) : "");
      return;
    }
    const text = el("textarea", { id: "policy-yaml", name: "policy", rows: "18", spellcheck: "false",
      "aria-describedby": "policy-help policy-problems" });
    text.value = p.yaml || "";
    const status = el("div");
    const byLine = el("span", {}, by);
    const form = el("form", { "aria-labelledby": "h-policy" },
      el("p", { id: "policy-help", class: "muted" }, byLine, " The YAML of docs/dispatch.md: flavors, cohorts, queues "
        + "(each team's quota per flavor and resource) and budgets. It is checked before anything is applied."),
      el("div", {}, el("label", { for: "policy-yaml" }, "Policy YAML")), text,
      el("div", { class: "actions" }, el("button", { type: "submit", class: "primary" }, "Apply policy")), status);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      problemsBox.replaceChildren();
      try {
        const r = await put("/dispatch/policy", { yaml: text.value, source: "console" });
        notice(status, "info", `Policy applied by ${r.applied_by} (log sequence ${r.seq}).`);
        byLine.textContent = `Applied by ${r.applied_by} from ${r.source} (log sequence ${r.seq}).`;
        shown = "";
        await refresh();
      } catch (err) {
        if (err.name === "AbortError") return;
        notice(status, "error", err.text || String(err));
        showProblems(text, (err.body && err.body.problems) || []);
      }
    });
    policyBox.replaceChildren(form);
  }

  function showProblems(text, problems) {
    if (!problems.length) return;
    const lines = text.value.split("\n");
    problemsBox.replaceChildren(el("h3", {}, "What to fix"), el("ul", { class: "problems" }, problems.map((p) =>
      el("li", {},
        el("strong", {}, p.line ? `Line ${p.line}, column ${p.column}` : "The file"),
        `: ${p.key ? `${p.key}: ` : ""}${p.message}`,
        p.line ? el("pre", { class: "yaml-line" }, `${p.line} | ${lines[p.line - 1] ?? ""}`) : "",
        p.line ? el("button", { type: "button", "aria-label": `Go to line ${p.line}`, onclick: () => {
          const [a, z] = lineSpan(text.value, p.line);
          text.focus();
          text.setSelectionRange(a, z);
        } }, "Go to line") : ""))));
  }

  await Promise.all([refresh(), showPolicy()]);
  const timer = setInterval(() => refresh().then(() => notice(msg, "", "")).catch(say), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}
