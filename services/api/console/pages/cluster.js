// A cluster: its facts and cost so far, nodes, jobs, the selected job's output live, the events
// timeline; the actions the caller's role allows (the API decides the rest and says why: a 403's
// detail is shown as it is).
import { get, post, query, stream } from "../api.js";
import { el, heading, notice, status, table, usd, when } from "../ui.js";

const REFRESH_MS = 3000;
const FINAL = new Set(["SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"]);
const MAX_LOG_LINES = 5000; // the page keeps the newest lines of a long output

export const mayAct = (me) => me.role !== "viewer";

export async function render(root, { me, args, signal, at }) {
  const name = args[0] || "";
  const path = `/clusters/${encodeURIComponent(name)}`;
  const msg = el("div", { "aria-live": "polite" });
  const facts = el("div");
  const actions = el("div");
  const nodesBox = el("div");
  const jobsBox = el("div");
  const logs = el("pre", { class: "logs", id: "logs", tabindex: "0", "aria-label": "Job output" });
  const logTitle = el("h2", { id: "h-logs" }, "Output");
  const logState = el("p", { class: "muted", role: "status", id: "log-state" });
  const timeline = el("ol", { class: "timeline", id: "timeline", "aria-label": "Events, oldest first" });
  root.append(heading(`Cluster ${name}`), msg, facts, actions,
    el("section", { "aria-labelledby": "h-nodes" }, el("h2", { id: "h-nodes" }, "Nodes"), nodesBox),
    el("section", { "aria-labelledby": "h-jobs" }, el("h2", { id: "h-jobs" }, "Jobs"), jobsBox),
    el("div", { class: "split" },
      el("section", { "aria-labelledby": "h-logs" }, logTitle, logState, logs),
      el("section", { "aria-labelledby": "h-events" }, el("h2", { id: "h-events" }, "Events"), timeline)));

  const say = (e) => { if (e.name !== "AbortError") notice(msg, "error", e.text || String(e)); };
  async function act(label, call) {
    try {
      const out = await call();
      notice(msg, "info", `${label}: requested${out && out.goal ? ` (the cluster goes ${out.goal})` : ""}.`);
      await refresh();
    } catch (e) {
      say(e);
    }
  }

  if (mayAct(me) && !at) {
    const minutes = el("input", { id: "autostop-min", type: "number", min: "0", max: "525600", value: "30", inputmode: "numeric" });
    actions.replaceChildren(el("h2", {}, "Actions"), el("div", { class: "actions" },
      el("button", { type: "button", onclick: () => act("Stop", () => post(`${path}/stop`)) }, "Stop"),
      el("button", { type: "button", onclick: () => act("Start", () => post(`${path}/start`)) }, "Start"),
      el("button", { type: "button", class: "danger", onclick: () => {
        if (confirm(`Tear down cluster ${name}? Its nodes and disks go.`)) act("Down", () => post(`${path}/down`));
      } }, "Down"),
      el("div", {}, el("label", { for: "autostop-min" }, "Autostop after idle minutes"), minutes),
      el("button", { type: "button", onclick: () => act("Autostop",
        () => post(`${path}/autostop`, { idle_minutes: Number(minutes.value) })) }, "Set autostop"),
      el("button", { type: "button", onclick: () => act("Autostop cancelled",
        () => post(`${path}/autostop`, { cancel: true })) }, "Cancel autostop")));
  }

  let following = null; // the job whose output is shown
  let logAbort = null;
  function follow(jobId) {
    if (following === jobId) return;
    following = jobId;
    if (logAbort) logAbort.abort();
    logAbort = new AbortController();
    signal.addEventListener("abort", () => logAbort.abort());
    logs.replaceChildren();
    logTitle.textContent = `Output of job ${jobId}`;
    logState.textContent = "following…";
    const mine = logAbort.signal;
    stream(`${path}/jobs/${jobId}/logs${query({ tail: 1000 })}`, (event, data) => {
      if (event === "line") {
        logs.append(`${data.line}\n`);
        while (logs.childNodes.length > MAX_LOG_LINES) logs.firstChild.remove();
        logs.scrollTop = logs.scrollHeight;
      } else if (event === "end") {
        logState.textContent = `job ${jobId} ended: ${data.status}${data.exit_code != null ? ` (exit ${data.exit_code})` : ""}`;
      } else if (event === "error") {
        logState.textContent = data.detail;
      }
    }, mine).catch((e) => { if (e.name !== "AbortError") logState.textContent = e.text || String(e); });
  }

  let shown = "";
  async function refresh() {
    const [c, q, ev] = await Promise.all([get(`${path}${query({ at })}`, { signal }),
      get(`${path}/jobs${query({ at })}`, { signal }), get(`${path}/events${query({ limit: 200, at })}`, { signal })]);
    const key = JSON.stringify([c, q, ev]);
    if (key === shown) return;
    shown = key;
    const nodes = Math.max(1, Number(c.num_nodes || 1));
    facts.replaceChildren(el("dl", { class: "facts" },
      ...fact("Status", status(c.status)),
      ...fact("Owner", `${c.owner.user || "-"} (team ${c.owner.team || "-"})`),
      ...fact("Where", [c.infra, c.region, c.zone].filter(Boolean).join(" / ") || "-"),
      ...fact("Resources", `${c.instance_type || "-"} ${c.market || ""} ×${nodes}`),
      ...fact("Autostop", c.autostop != null ? `${c.autostop} min idle${c.autodown ? ", then down" : ""}` : "off"),
      ...fact("Price", `${usd(Number(c.hourly_price_micros || 0) * nodes)}/h`),
      ...fact("Cost so far", c.cost_usd != null ? `$${c.cost_usd}` : "-"),
      ...fact("Launched", when(c.launched_at) || "-")));
    nodesBox.replaceChildren(table("Nodes", [
      ["Rank", (n) => String(n.rank), "num"], ["Status", (n) => status(n.status)],
      ["Host", (n) => n.host || n.public_ip || n.private_ip || ""], ["Instance", (n) => n.instance_id || ""],
      ["Zone", (n) => n.zone || ""], ["Ready", (n) => when(n.ready_at)],
    ], c.nodes || [], "no nodes yet"));
    jobsBox.replaceChildren(table("Jobs", [
      ["ID", (j) => String(j.job_id), "num"], ["Name", (j) => j.name || ""], ["Status", (j) => status(j.status)],
      ["User", (j) => j.user || ""], ["Submitted", (j) => when(j.submitted_at)],
      ["", (j) => el("div", { class: "actions" },
        at ? null : el("button", { type: "button", "aria-label": `Show output of job ${j.job_id}`, onclick: () => follow(j.job_id) }, "Output"),
        mayAct(me) && !at && !FINAL.has(j.status) ? el("button", { type: "button", class: "danger",
          "aria-label": `Cancel job ${j.job_id}`,
          onclick: () => act(`Cancel of job ${j.job_id}`, () => post(`${path}/jobs/${j.job_id}/cancel`)) }, "Cancel") : null)],
    ], q.jobs, "no jobs"));
    timeline.replaceChildren(...ev.events.map((e) => el("li", {},
      el("time", { datetime: e.time }, when(e.time)), el("strong", {}, e.type), " ",
      el("span", { class: "muted" }, describe(e.summary)))));
    timeline.scrollTop = timeline.scrollHeight;
    if (following === null && q.jobs.length && !at) follow(Math.max(...q.jobs.map((j) => j.job_id)));
  }

  await refresh();
  if (at) { // a past moment: still; its output is read from now, not rebuilt
    logState.textContent = "output is shown for now only (leave time travel to follow it)";
    return;
  }
  const timer = setInterval(() => refresh().catch(say), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}

function fact(k, v) {
  return [el("dt", {}, k), el("dd", {}, v)];
}

// A timeline row's detail: the event's fields but the ones every cluster event has.
export function describe(summary) {
  return Object.entries(summary || {}).filter(([k, v]) => k !== "cluster" && v !== null && v !== "")
    .map(([k, v]) => `${k}=${v}`).join("  ");
}
