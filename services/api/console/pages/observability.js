// Observability (admins): each GPU's utilisation from its node's last sample, goodput (useful over
// paid GPU time) by team and by managed job, and the GPU health findings with the clusters drained
// on them (GET /api/v1/observability/gpus, /goodput, /health). At a past moment only the findings
// are rebuilt (they are events); samples are not on the log, so utilisation and goodput are now's.
import { get, query } from "../api.js";
import { bars } from "../chart.js";
import { el, heading, link, notice, table, when } from "../ui.js";

const REFRESH_MS = 3000;

const pct = (v) => (v === null || v === undefined ? "-" : `${Number(v).toFixed(0)} %`);
const num = (v, unit) => (v === null || v === undefined ? "-" : `${Number(v).toFixed(0)} ${unit}`);
// GPU time: seconds under an hour (a short run's 10 GPU-s is not "0.00 GPU-h"), else hours.
const gpuTime = (s) => (Number(s || 0) < 3600 ? `${Number(s || 0).toFixed(0)} GPU-s` : `${(Number(s) / 3600).toFixed(2)} GPU-h`);
const clusterLink = (name) => link(`#/cluster/${encodeURIComponent(name)}`, name);

export async function render(root, { me, signal, at }) {
  root.append(heading("Observability"));
  if (me.role !== "admin") {
    root.append(el("p", { class: "notice info", role: "status" },
      "GPU utilisation, goodput and GPU health span every team's nodes: they are for admins (as /metrics is)."));
    return;
  }
  const gpuMsg = el("div");
  const gpus = el("div");
  const goodMsg = el("div");
  const goodput = el("div");
  const healthMsg = el("div");
  const health = el("div");
  root.append(
    el("section", { "aria-labelledby": "h-gpus" }, el("h2", { id: "h-gpus" }, "GPU utilisation"),
      el("p", { class: "muted" }, "Each GPU as its node's last sample saw it (the node agents sample every few seconds), "
        + "read through DCGM or nvidia-smi (Source); corrected (single-bit) ECC errors come from DCGM only."),
      gpuMsg, gpus),
    el("section", { "aria-labelledby": "h-goodput" }, el("h2", { id: "h-goodput" }, "Goodput"),
      el("p", { class: "muted" }, "Useful GPU time (a GPU busy in the samples) over the GPU time the ledger metered, "
        + "since the observability service started; idle dollars are what the idle share cost."), goodMsg, goodput),
    el("section", { "aria-labelledby": "h-health" }, el("h2", { id: "h-health" }, "GPU health"),
      el("p", { class: "muted" }, "Findings of the GPU health manager, newest first. A fatal one drains its cluster "
        + "(no new job is admitted there) and recovers its managed job elsewhere."), healthMsg, health));
  const fail = (box) => (e) => { if (e.name !== "AbortError") notice(box, "error", e.text || String(e)); };

  const shown = {};
  const changed = (key, data) => {
    const text = JSON.stringify(data);
    if (shown[key] === text) return false;
    shown[key] = text;
    return true;
  };

  async function loadGpus() {
    const g = await get("/observability/gpus", { signal });
    notice(gpuMsg, "", "");
    if (!changed("gpus", g)) return;
    const rows = g.gpus || [];
    const withGpu = rows.filter((r) => r.gpu_index !== null && r.utilization_pct !== null);
    gpus.replaceChildren(
      withGpu.length ? bars("GPU utilisation", withGpu.map((r) => ({
        label: `${r.cluster}/${r.rank}/gpu${r.gpu_index}`, value: Number(r.utilization_pct), text: pct(r.utilization_pct),
      })), 640, 100) : "",
      table("Each GPU's last sample", [
        ["Cluster", (r) => clusterLink(r.cluster)], ["Node", (r) => String(r.rank), "num"],
        ["GPU", (r) => (r.gpu_index === null ? "-" : String(r.gpu_index)), "num"], ["Model", (r) => r.name || "-"],
        ["Utilisation", (r) => pct(r.utilization_pct), "num"],
        ["Memory", (r) => (r.memory_total_mib ? `${num(r.memory_used_mib, "")}/ ${num(r.memory_total_mib, "MiB")}` : "-"), "num"],
        ["Temp", (r) => num(r.temperature_c, "°C"), "num"], ["Power", (r) => num(r.power_w, "W"), "num"],
        ["ECC corrected", (r) => (r.ecc_corrected_volatile === null || r.ecc_corrected_volatile === undefined
          ? "-" : String(r.ecc_corrected_volatile)), "num"],
        ["Source", (r) => r.gpu_source || "-"],
        ["CPU", (r) => pct(r.cpu_pct), "num"], ["Sampled", (r) => when(r.sampled_at)],
        ["Note", (r) => r.gpu_error || (r.findings ? `${r.findings} finding(s)` : "")],
      ], rows, "no node sample heard yet"));
  }

  async function loadGoodput() {
    const g = await get("/observability/goodput", { signal });
    notice(goodMsg, g.ledger ? "" : "info", g.ledger ? "" : "the ledger did not answer: paid GPU time is unknown");
    if (!changed("goodput", g)) return;
    const cols = (what) => [
      [what, (r) => String(r.key)], ["Useful", (r) => gpuTime(r.useful_s), "num"], ["Paid", (r) => gpuTime(r.paid_s), "num"],
      ["Goodput", (r) => (r.ratio === null ? "-" : `${(r.ratio * 100).toFixed(0)} %`), "num"],
      ["Idle $", (r) => `$${Number(r.idle_dollars || 0).toFixed(2)}`, "num"]];
    goodput.replaceChildren(
      el("h3", {}, "By team"), table("Goodput by team", cols("Team"), g.team || [], "no GPU time yet"),
      el("h3", {}, "By managed job"), table("Goodput by managed job", cols("Managed job"), g.job || [], "no GPU time yet"));
  }

  async function loadHealth() {
    const h = await get(`/observability/health${query({ at })}`, { signal });
    if (!changed("health", h)) return;
    const drained = h.drained_clusters || [];
    health.replaceChildren(
      el("p", { id: "drained" }, drained.length ? "Drained: " : "No cluster is drained.",
        ...drained.flatMap((c, n) => [n ? ", " : "", clusterLink(c)])),
      table("GPU health findings, newest first", [
        ["Detected", (f) => when(f.detected_at)], ["Cluster", (f) => clusterLink(f.cluster)],
        ["Node", (f) => String(f.rank), "num"], ["GPU", (f) => (f.gpu_index === null ? "node" : String(f.gpu_index)), "num"],
        ["Rule", (f) => f.rule], ["Severity", (f) => el("span", { class: `status ${f.severity}` }, f.severity)],
        ["What", (f) => f.detail], ["Drained", (f) => (f.drained ? "yes" : "no")],
      ], h.findings || [], "no finding"));
  }

  async function refresh() {
    await Promise.all([
      at ? null : loadGpus().catch(fail(gpuMsg)),
      at ? null : loadGoodput().catch(fail(goodMsg)),
      loadHealth().catch(fail(healthMsg)),
    ]);
  }
  if (at) {
    notice(gpuMsg, "info", "Samples are not on the log: utilisation is not rebuilt at a past moment.");
    notice(goodMsg, "info", "Goodput comes from samples: it is not rebuilt at a past moment.");
  }
  await refresh();
  if (at) return; // the past does not change
  const timer = setInterval(() => refresh(), REFRESH_MS);
  signal.addEventListener("abort", () => clearInterval(timer));
}
