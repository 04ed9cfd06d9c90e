// Admin: users, teams and tokens. A new token is shown once, in the answer of the request that
// made it (the log holds only its digest); revoking one is an event like any other.
import { del, get, post } from "../api.js";
import { el, heading, notice, table } from "../ui.js";

export async function render(root, { me, signal }) {
  const msg = el("div", { "aria-live": "polite" });
  const shownToken = el("div", { id: "new-token" });
  const usersBox = el("div");
  const teamsBox = el("div");
  const tokensBox = el("div");
  const say = (e) => { if (e.name !== "AbortError") notice(msg, "error", e.text || String(e)); };

  const uname = el("input", { id: "u-name", name: "name", required: true, maxlength: "63", pattern: "[a-z0-9][a-z0-9_\\-]*",
    autocomplete: "off", "aria-describedby": "u-name-help" });
  const uteam = el("select", { id: "u-team", name: "team", required: true });
  const urole = el("select", { id: "u-role", name: "role" }, ["member", "viewer", "admin"].map((r) => el("option", { value: r }, r)));
  const userForm = el("form", { class: "inline", "aria-labelledby": "h-add-user" },
    el("div", {}, el("label", { for: "u-name" }, "Name"), uname),
    el("div", {}, el("label", { for: "u-team" }, "Team"), uteam),
    el("div", {}, el("label", { for: "u-role" }, "Role"), urole),
    el("button", { type: "submit", class: "primary" }, "Add user"));
  const tname = el("input", { id: "t-name", name: "name", required: true, maxlength: "63", pattern: "[a-z0-9][a-z0-9_\\-]*", autocomplete: "off" });
  const teamForm = el("form", { class: "inline", "aria-labelledby": "h-add-team" },
    el("div", {}, el("label", { for: "t-name" }, "Team name"), tname),
    el("button", { type: "submit", class: "primary" }, "Add team"));

  root.append(heading("Admin"), msg, shownToken,
    el("section", { "aria-labelledby": "h-users" }, el("h2", { id: "h-users" }, "Users"), usersBox,
      el("h2", { id: "h-add-user" }, "Add a user"),
      el("p", { id: "u-name-help", class: "muted" }, "Lower-case letters, digits, - and _ (at most 63)."), userForm),
    el("section", { "aria-labelledby": "h-tokens" }, el("h2", { id: "h-tokens" }, "Tokens"), tokensBox),
    el("section", { "aria-labelledby": "h-teams" }, el("h2", { id: "h-teams" }, "Teams"), teamsBox,
      el("h2", { id: "h-add-team" }, "Add a team"), teamForm));

  function showOnce(user, token) {
    shownToken.replaceChildren(el("div", { class: "notice info", role: "status" },
      el("p", {}, `${user}'s token, shown this once: copy it now. The server keeps only its digest.`),
      el("p", { class: "token", id: "token-value" }, token),
      el("button", { type: "button", onclick: () => shownToken.replaceChildren() }, "I have copied it")));
  }

  async function tokensOf(user) {
    const t = await get(`/users/${encodeURIComponent(user)}/tokens`, { signal });
    tokensBox.replaceChildren(table(`${user}'s live tokens`, [
      ["Token id", (x) => x.token_id], ["Kind", (x) => (x.service_account ? "service account" : "personal")],
      ["", (x) => el("button", { type: "button", class: "danger", "aria-label": `Revoke token ${x.token_id} of ${user}`,
        onclick: () => run(async () => {
          await del(`/users/${encodeURIComponent(user)}/tokens/${x.token_id}`);
          notice(msg, "info", `Token ${x.token_id} of ${user} revoked.`);
          await tokensOf(user);
        }) }, "Revoke")],
    ], t.tokens, "no live tokens"));
  }

  async function run(fn) {
    try {
      await fn();
      await refresh();
    } catch (e) {
      say(e);
    }
  }

  async function refresh() {
    const [u, t] = await Promise.all([get("/users", { signal }), get("/teams", { signal })]);
    const chosen = uteam.value;
    uteam.replaceChildren(...t.teams.map((x) => el("option", { value: x.name, selected: x.name === (chosen || me.team) }, x.name)));
    usersBox.replaceChildren(table("Users", [
      ["Name", (x) => x.name], ["Team", (x) => x.team], ["Role", (x) => x.role],
      ["Live tokens", (x) => String(x.tokens), "num"],
      ["", (x) => el("div", { class: "actions" },
        el("button", { type: "button", "aria-label": `Tokens of ${x.name}`, onclick: () => tokensOf(x.name).catch(say) }, "Tokens"),
        el("button", { type: "button", "aria-label": `New token for ${x.name}`, onclick: () => run(async () => {
          const r = await post(`/users/${encodeURIComponent(x.name)}/token`);
          showOnce(x.name, r.token);
        }) }, "New token"),
        x.name === me.user ? null : el("button", { type: "button", class: "danger", "aria-label": `Remove ${x.name}`,
          onclick: () => {
            if (confirm(`Remove ${x.name}? Every token of theirs stops working.`)) {
              run(async () => { await del(`/users/${encodeURIComponent(x.name)}`); notice(msg, "info", `${x.name} removed.`); });
            }
          } }, "Remove"))],
    ], u.users));
    teamsBox.replaceChildren(table("Teams", [
      ["Name", (x) => x.name], ["Members", (x) => x.members.join(", ")],
      ["Infras", (x) => x.allowed_infras.join(", ") || "any"],
      ["", (x) => (x.members.length ? null : el("button", { type: "button", class: "danger", "aria-label": `Remove team ${x.name}`,
        onclick: () => run(async () => { await del(`/teams/${encodeURIComponent(x.name)}`); notice(msg, "info", `Team ${x.name} removed.`); }) },
      "Remove"))],
    ], t.teams));
  }

  userForm.addEventListener("submit", (e) => {
    e.preventDefault();
    run(async () => {
      const r = await post("/users", { name: uname.value.trim(), team: uteam.value, role: urole.value });
      showOnce(r.name, r.token);
      notice(msg, "info", `${r.name} added to team ${r.team} as ${r.role}.`);
      uname.value = "";
    });
  });
  teamForm.addEventListener("submit", (e) => {
    e.preventDefault();
    run(async () => {
      await post("/teams", { name: tname.value.trim() });
      notice(msg, "info", `Team ${tname.value.trim()} added.`);
      tname.value = "";
    });
  });
  await refresh();
}
