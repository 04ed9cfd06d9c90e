// The console's shell: sign in with a token, the navigation, and one page at a time (hash routes,
// so the server serves only static files). Each page gets an AbortSignal, aborted when the user
// leaves it: its streams and timers stop with it. `?at=TIME` in the address (time travel) hands
// the pages a past moment: they ask the API for the log as it stood then, and show it still.
import { ApiError, get, token } from "./api.js";
import { el, notice } from "./ui.js";
import * as overview from "./pages/overview.js";
import * as cluster from "./pages/cluster.js";
import * as job from "./pages/job.js";
import * as cost from "./pages/cost.js";
import * as admin from "./pages/admin.js";
import * as dispatch from "./pages/dispatch.js";
import * as observability from "./pages/observability.js";

const PAGES = { overview, cluster, job, cost, dispatch, observability, admin };
let current = null; // the AbortController of the page shown

const main = () => document.getElementById("main");

async function whoami() {
  const health = await get("/health");
  // On the embedded default a loopback caller without a token is the local user (docs/team.md).
  return health.caller || null;
}

function showLogin(message) {
  document.getElementById("nav").hidden = true;
  document.getElementById("who").hidden = true;
  const input = el("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true,
    "aria-describedby": "token-help", spellcheck: "false" });
  const box = el("div");
  const form = el("form", { class: "login", "aria-labelledby": "login-title" },
    el("h1", { id: "login-title" }, "Sign in"),
    el("p", { id: "token-help", class: "muted" },
      "Your API token (spz_…): an admin makes one with spz users add NAME --team TEAM, or on the Admin page. "
      + "It is kept in this tab only."),
    el("div", {}, el("label", { for: "token" }, "API token")),
    el("p", {}, input),
    box,
    el("button", { type: "submit", class: "primary" }, "Sign in"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    token.set(input.value.trim());
    try {
      if (await whoami()) return route();
      token.clear();
      notice(box, "error", "That token is not valid: unknown, revoked, or its user was removed.");
    } catch (err) {
      token.clear();
      notice(box, "error", err instanceof ApiError ? err.text : String(err));
    }
    input.focus();
  });
  main().replaceChildren(form);
  if (message) notice(box, "info", message);
  input.focus();
}

function showChrome(me, page) {
  document.getElementById("nav").hidden = false;
  document.getElementById("nav-admin").hidden = me.role !== "admin";
  document.getElementById("nav-observability").hidden = me.role !== "admin";
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.getElementById("who").hidden = false;
  document.getElementById("who-text").textContent = `${me.user} (team ${me.team || "-"}, ${me.role}${me.local ? ", local" : ""})`;
}

async function route() {
  if (current) current.abort();
  current = new AbortController();
  const signal = current.signal;
  let me;
  try {
    me = await whoami();
  } catch (err) {
    main().replaceChildren(el("div", { class: "notice error", role: "alert" }, err.text || String(err)));
    return;
  }
  if (!me) {
    if (!token.get()) return showLogin();
    token.clear();
    return showLogin("Your token is no longer valid; sign in again.");
  }
  const [name, ...args] = (location.hash.replace(/^#\/?/, "") || "overview").split("/").map(decodeURIComponent);
  const page = PAGES[name] ? name : "overview";
  showChrome(me, page);
  const root = el("div");
  const at = pastMoment();
  main().replaceChildren(...(at ? [travelBanner(at)] : []), root);
  try {
    await PAGES[page].render(root, { me, args, signal, at });
  } catch (err) {
    if (err.name === "AbortError") return;
    root.replaceChildren(el("div", { class: "notice error", role: "alert" }, err.text || String(err)));
  }
  if (!signal.aborted) root.querySelector("h1")?.focus();
}

// The page's past moment (`?at=`), or null for now; the API checks it (a bad one is its 422).
export function pastMoment() {
  const at = new URLSearchParams(location.search).get("at");
  return at && at.trim() ? at.trim() : null;
}

function travelBanner(at) {
  return el("div", { class: "notice travel", role: "status" },
    `Time travel: the log as it stood at ${at}. Nothing here changes or can be acted on. `,
    el("a", { href: `${location.pathname}${location.hash}` }, "Back to now"));
}

document.getElementById("signout").addEventListener("click", () => {
  token.clear();
  if (current) current.abort();
  location.hash = "#/overview";
  showLogin("Signed out.");
});
window.addEventListener("hashchange", route);
route();
