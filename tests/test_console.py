"""The web console in a real browser: Debian's chromium driven by playwright (sync API; never
`playwright install`), against a real control plane on the `local` infra (nats-server, the
services, real node agents: tests/support/local_cli.py) and the API server as its own process
(tokens only).

In order, on one plane and one browser (module-scoped): log in with a token (a wrong one is
refused on the page); a cluster appears on the overview after a real `spz launch`; its page
follows the job's output live and shows its nodes and events; another member's cancel is refused
with the API's 403 shown, a viewer is offered no action, the owner cancels; a managed job's page
shows its placement, history and output; an admin adds a user whose token is shown once, and
revokes it; after the owner tears the cluster down from its page, the cost page's total and lines
equal `spz cost-report`'s, and its CSV export holds the same lines.

Every page is watched: a browser console error, an uncaught exception or a failed request fails
the test, but for the refusals a test names (`Watch.allow`). Each page's screenshot is written
under the test's tmp dir and copied to docs/img/console-*.png (docs/console.md shows them).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from api_harness import Api, team_of_four
from local_cli import REPO, local_cli, spz

STAGE = "test"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DOCS_IMG = REPO / "docs" / "img"
LAUNCH_RUN = "echo web-start; for i in $(seq 1 600); do echo web-line-$i; sleep 0.3; done"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("console")
    with local_cli(tmp, STAGE) as env:
        alice, bob, vera, root = team_of_four(env)
        (Path(env["SKYPURZA_HOME"]) / "config.yaml").write_text("teams:\n  alice: ml\n")  # alice's launches: team ml
        api = Api(SimpleNamespace(url=f"nats://127.0.0.1:{env['SKYPURZA_NATS_PORT']}"), tmp)
        try:
            yield SimpleNamespace(env=env, api=api, tokens={"alice": alice, "bob": bob, "vera": vera, "root": root})
        finally:
            out = api.close()
        assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def browser() -> Any:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Watch:
    """What went wrong on a page: console errors, uncaught exceptions, failed requests, answers >= 400."""

    def __init__(self, page: Page) -> None:
        self.problems: list[str] = []
        self.allowed: list[tuple[int, str]] = []  # (status, path part) a test expects the API to refuse
        self.statuses: dict[str, int] = {}
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"uncaught: {exc}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)

    def allow(self, status: int, path_part: str) -> None:
        self.allowed.append((status, path_part))

    def _expected(self, status: int, url: str) -> bool:
        return any(status == s and part in url for s, part in self.allowed)

    def _console(self, msg: Any) -> None:
        if msg.type != "error":
            return
        url = (msg.location or {}).get("url", "")
        found = re.search(r"status of (\d{3})", msg.text)
        if found and self._expected(int(found.group(1)), url):
            return  # chromium's own line for a refusal the test asked for
        self.problems.append(f"console error: {msg.text} ({url})")

    def _failed(self, request: Any) -> None:
        # A stream the page stops when it leaves (a job's output) is aborted on purpose, and so is
        # the sign-in check still in flight when the test navigates to another page (a past one):
        # chromium cancels a leaving page's fetches. Any other failure is the page's.
        if request.failure == "net::ERR_ABORTED" and re.search(r"/(logs|health)(\?|$)", request.url):
            return
        self.problems.append(f"request failed: {request.method} {request.url}: {request.failure}")

    def _response(self, response: Any) -> None:
        if response.status >= 400 and not self._expected(response.status, response.url):
            self.problems.append(f"HTTP {response.status}: {response.request.method} {response.url}")


@pytest.fixture
def open_as(browser: Browser, plane: Any) -> Any:
    """open_as(user) -> (page, watch): a fresh browser context signed in as `user` (None: not signed in)."""
    opened: list[tuple[Any, Watch]] = []

    def open_(user: str | None, width: int = 1280) -> tuple[Page, Watch]:
        ctx = browser.new_context(viewport={"width": width, "height": 900}, accept_downloads=True)
        page = ctx.new_page()
        page.set_default_timeout(WAIT_MS)
        watch = Watch(page)
        opened.append((ctx, watch))
        page.goto(plane.api.url + "/")
        if user is not None:
            page.get_by_label("API token").fill(plane.tokens[user])
            page.get_by_label("API token").press("Enter")  # the keyboard signs in
            expect(page.locator("#who-text")).to_contain_text(user)
        return page, watch

    yield open_
    problems = [p for _, w in opened for p in w.problems]
    for ctx, _ in opened:
        ctx.close()
    assert not problems, problems


def shot(page: Page, tmp_path: Path, name: str) -> None:
    """The page's screenshot under the test's tmp dir, and as docs/img/console-NAME.png."""
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    DOCS_IMG.mkdir(exist_ok=True)
    shutil.copyfile(path, DOCS_IMG / path.name)


def unlabelled_controls(page: Page) -> list[str]:
    """Inputs, selects and buttons with no accessible name (no label, no text, no aria-label)."""
    return page.evaluate("""() => [...document.querySelectorAll('input, select, button')]
        .filter(e => !e.closest('[hidden]'))
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
        .map(e => e.outerHTML.slice(0, 120))""")


def wait_until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_log_in_and_see_a_cluster_appear_after_spz_launch(plane: Any, open_as: Any, tmp_path: Path) -> None:
    page, _ = open_as(None)
    assert page.url.endswith("/console/"), page.url  # / redirects to the console
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert page.locator("header[role=banner]").count() == 1 and page.locator("main").count() == 1
    expect(page.get_by_role("button", name="Sign out")).to_be_hidden()  # nobody is signed in yet
    shot(page, tmp_path, "login")
    assert page.evaluate("() => document.activeElement.id") == "token", "the form takes the keyboard at once"
    page.keyboard.press("Shift+Tab")  # before it, the page's one other stop: skipping to the content
    assert page.evaluate("() => document.activeElement.textContent") == "Skip to content"
    page.get_by_label("API token").fill("spz_0000_not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    page.get_by_label("API token").fill(plane.tokens["alice"])
    page.get_by_label("API token").press("Enter")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.locator("#who-text")).to_have_text("alice (team ml, member)")
    assert page.locator("#nav-admin").is_hidden(), "a member is offered no admin page"
    assert page.evaluate("() => sessionStorage.getItem('spz.console.token')") == plane.tokens["alice"]

    env = {**plane.env, "SKYPURZA_USER": "alice"}
    r = spz(env, "launch", "-y", "-d", "-c", "web", "--infra", "local", LAUNCH_RUN, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    row = page.locator("table", has=page.locator("caption", has_text="Clusters")).locator("tr", has_text="web")
    expect(row).to_contain_text("UP")  # the page refreshes itself: no reload
    expect(row).to_contain_text("alice")
    assert unlabelled_controls(page) == []
    shot(page, tmp_path, "overview")

    page.set_viewport_size({"width": 390, "height": 844})  # a phone: nothing wider than the screen
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    shot(page, tmp_path, "overview-phone")


def test_a_clusters_page_follows_its_jobs_output_live(plane: Any, open_as: Any, tmp_path: Path) -> None:
    page, _ = open_as("alice")
    page.goto(plane.api.url + "/console/#/cluster/web")
    expect(page.get_by_role("heading", name="Cluster web")).to_be_focused()
    logs = page.locator("#logs")
    expect(logs).to_contain_text("web-start")

    def last_line() -> int:
        return max([int(n) for n in re.findall(r"web-line-(\d+)", logs.inner_text())] or [0])

    first = wait_until("a first line", last_line)
    wait_until("lines that came after the page opened", lambda: last_line() >= first + 3, 30)
    expect(page.locator("#log-state")).to_have_text("following…")  # the job runs on
    nodes = page.locator("table", has=page.locator("caption", has_text="Nodes"))
    expect(nodes.locator("tbody tr")).to_have_count(1)
    timeline = page.locator("#timeline")
    expect(timeline).to_contain_text("cluster_provisioned")
    expect(timeline).to_contain_text("job_started")
    expect(page.get_by_role("button", name="Cancel job 1")).to_be_visible()
    assert unlabelled_controls(page) == []
    shot(page, tmp_path, "cluster")
    page.set_viewport_size({"width": 390, "height": 844})
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 390


def test_another_member_is_refused_a_viewer_offered_nothing_and_the_owner_cancels(plane: Any, open_as: Any) -> None:
    bob, watch = open_as("bob")
    bob.get_by_label("Show").select_option("team")  # alice's cluster is bob's team's
    expect(bob.locator("tr", has_text="web")).to_contain_text("alice")
    bob.goto(plane.api.url + "/console/#/cluster/web")
    watch.allow(403, "/api/v1/clusters/web/jobs/1/cancel")
    bob.get_by_role("button", name="Cancel job 1").click()
    expect(bob.get_by_role("alert")).to_have_text(
        "Forbidden (403): this is alice's; acting on another user's clusters and jobs is for admins")

    vera, _ = open_as("vera")
    vera.goto(plane.api.url + "/console/#/cluster/web")
    expect(vera.locator("#logs")).to_contain_text("web-line-")  # viewers read their team's logs
    assert vera.get_by_role("button", name="Cancel job 1").count() == 0
    assert vera.get_by_role("button", name="Down").count() == 0

    alice, _ = open_as("alice")
    alice.goto(plane.api.url + "/console/#/cluster/web")
    alice.get_by_role("button", name="Cancel job 1").click()
    expect(alice.get_by_role("status").filter(has_text="Cancel of job 1: requested")).to_be_visible()
    expect(alice.locator("#log-state")).to_contain_text("job 1 ended: CANCELLED")
    expect(alice.locator("table", has=alice.locator("caption", has_text="Jobs")).locator("tbody tr").first) \
        .to_contain_text("CANCELLED")
    r = plane.api.http.get("/api/v1/clusters/web/jobs", headers=plane.api.as_(plane.tokens["alice"]))
    assert r.json()["jobs"][0]["status"] == "CANCELLED", r.text


def test_a_managed_jobs_page_shows_its_placement_history_and_output(plane: Any, open_as: Any, tmp_path: Path) -> None:
    api, alice_token = plane.api, plane.tokens["alice"]
    res = api.http.post("/api/v1/jobs", headers=api.as_(alice_token),
                        json={"task": "name: hello\nrun: echo managed-hello\n", "overrides": {"infra": "local"}})
    assert res.status_code == 202, res.text
    job_id = res.json()["job_id"]
    page, _ = open_as("alice")
    page.goto(plane.api.url + f"/console/#/job/{job_id}")
    expect(page.get_by_role("heading", name=f"Managed job {job_id}")).to_be_visible()
    expect(page.locator("#logs")).to_contain_text("managed-hello")
    expect(page.locator("#log-state")).to_have_text("managed job ended: SUCCEEDED")
    placements = page.locator("table", has=page.locator("caption", has_text="Where each launch ran"))
    expect(placements.locator("tbody tr")).to_have_count(1)
    expect(placements.locator("tbody tr")).to_contain_text("local")
    history = page.locator("table", has=page.locator("caption", has_text="Each status change"))
    expect(history).to_contain_text("SUCCEEDED")
    expect(history).to_contain_text("launch")
    expect(page.locator("#preemptions")).to_have_text("0")
    shot(page, tmp_path, "job")
    # The history the page draws is the API's: the same placements and changes.
    h = api.http.get(f"/api/v1/jobs/{job_id}/history", headers=api.as_(alice_token)).json()
    assert [p["infra"] for p in h["placements"]] == ["local"] and h["changes"][-1]["status"] == "SUCCEEDED", h
    assert history.locator("tbody tr").count() == len(h["changes"])


def test_an_admin_adds_a_user_whose_token_is_shown_once_and_revokes_it(plane: Any, open_as: Any,
                                                                        tmp_path: Path) -> None:
    alice, watch = open_as("alice")
    watch.allow(403, "/api/v1/users")
    watch.allow(403, "/api/v1/teams")
    alice.goto(plane.api.url + "/console/#/admin")
    expect(alice.get_by_role("alert")).to_contain_text("managing users and teams is for admins")

    page, _ = open_as("root")
    page.get_by_role("link", name="Admin").click()
    expect(page.get_by_role("heading", name="Admin")).to_be_visible()
    page.get_by_label("Name", exact=True).fill("carol")
    page.get_by_label("Team", exact=True).select_option("ml")
    page.get_by_label("Role").select_option("viewer")
    page.get_by_role("button", name="Add user").click()
    token = page.locator("#token-value").inner_text()
    assert token.startswith("spz_"), token
    expect(page.locator("tr", has_text="carol").first).to_contain_text("viewer")
    assert unlabelled_controls(page) == []
    shot(page, tmp_path, "admin")

    def caller(t: str) -> Any:
        return httpx.get(f"{plane.api.url}/api/v1/health", headers={"Authorization": f"Bearer {t}"}).json()["caller"]

    wait_until("carol's token accepted", lambda: (caller(token) or {}).get("user") == "carol", 20)
    page.reload()  # shown once: never again
    expect(page.get_by_role("heading", name="Admin")).to_be_visible()
    assert token not in page.content()
    page.get_by_role("button", name="Tokens of carol").click()
    page.get_by_role("button", name=re.compile("^Revoke token .* of carol$")).click()
    expect(page.get_by_role("status").filter(has_text="of carol revoked")).to_be_visible()
    expect(page.locator("table", has=page.locator("caption", has_text="carol's live tokens"))).to_contain_text(
        "no live tokens")
    wait_until("carol's token refused", lambda: caller(token) is None, 20)


def test_the_cost_pages_total_equals_spz_cost_report(plane: Any, open_as: Any, tmp_path: Path) -> None:
    alice, _ = open_as("alice")
    alice.goto(plane.api.url + "/console/#/cluster/web")
    alice.once("dialog", lambda d: d.accept())
    alice.get_by_role("button", name="Down").click()
    expect(alice.locator("dl.facts")).to_contain_text("TERMINATED")
    api = plane.api

    def all_down() -> bool:
        r = api.http.get("/api/v1/clusters", headers=api.as_(plane.tokens["root"]))
        return r.status_code == 200 and r.json()["clusters"] == []

    wait_until("every cluster down (nothing accrues while the two reports are read)", all_down)
    r = spz(plane.env, "cost-report", "--by", "user", "-o", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    cli = json.loads(r.stdout)
    assert any(line["key"] == "alice" and line["billing_seconds"] > 0 for line in cli["lines"]), cli

    page, _ = open_as("root")
    page.get_by_role("link", name="Cost").click()
    page.get_by_label("Group by").select_option("user")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("caption", has_text="Cost by user")).to_be_visible()
    expect(page.locator("#total")).to_have_text(f"${cli['total']['cost_usd']}")
    rows = page.locator("table", has=page.locator("caption", has_text="Cost by user")).locator("tbody tr")
    shown = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    assert shown == [[str(x["key"]), x["kind"], x["for_period"] or "", str(x["billing_minutes"]), x["cost_usd"]]
                     for x in cli["lines"]], (shown, cli["lines"])
    assert page.locator("svg.chart rect").count() == sum(1 for x in cli["lines"] if x["kind"] == "usage")
    with page.expect_download() as dl:
        page.get_by_role("button", name="Export CSV").click()
    exported = list(csv.DictReader(io.StringIO(Path(dl.value.path()).read_text())))
    assert [(x["user"], x["cost_micros"], x["billing_seconds"]) for x in exported] == \
        [(x["key"], str(x["cost_micros"]), str(x["billing_seconds"])) for x in cli["lines"]]
    shot(page, tmp_path, "cost")


def _policy(nominal: int, key: str = "nominal") -> str:
    return ("flavors:\n  - name: local\n    infra: local\nqueues:\n  - name: ml\n    team: ml\n    quotas:\n"
            f"      - flavor: local\n        resources:\n          cpu: {{{key}: {nominal}}}\n"
            "budgets:\n  - team: ml\n    period: month\n    limit_usd: 50\n"
            "priority:\n  weights: {age: 1000, fairshare: 10000}\n")


def test_an_admin_raises_a_teams_quota_and_a_held_launch_is_admitted(plane: Any, open_as: Any,
                                                                     tmp_path: Path) -> None:
    """The dispatch page: the policy editor shows the validator's problems at their line; a real
    `spz launch --async` beyond the team's quota waits with dispatch's reason; the admin raises the
    quota on the page and the launch is admitted, its quota shown in use, its cluster UP."""
    page, watch = open_as("root")
    page.get_by_role("link", name="Dispatch").click()
    expect(page.get_by_role("heading", name="Dispatch")).to_be_visible()
    expect(page.locator("#main")).to_contain_text("No dispatch policy")
    editor = page.get_by_label("Policy YAML")
    watch.allow(422, "/api/v1/dispatch/policy")
    editor.fill(_policy(1, "nominall"))
    page.get_by_role("button", name="Apply policy").click()
    expect(page.get_by_role("alert")).to_contain_text("unknown key")
    problems = page.locator("#policy-problems")
    expect(problems).to_contain_text("Line 10, column 17: queues[0].quotas[0].resources.cpu.nominall: unknown key")
    expect(problems.locator("pre")).to_have_text("10 |           cpu: {nominall: 1}")
    page.get_by_role("button", name="Go to line 10").click()
    assert page.evaluate("() => { const t = document.activeElement; return t.id === 'policy-yaml' && "
                         "t.value.slice(t.selectionStart, t.selectionEnd); }") == "          cpu: {nominall: 1}"
    editor.fill(_policy(1))
    page.get_by_role("button", name="Apply policy").click()
    expect(page.get_by_role("status").filter(has_text="Policy applied by root")).to_be_visible()

    env = {**plane.env, "SKYPURZA_USER": "alice"}
    r = spz(env, "launch", "-y", "--async", "-c", "held", "--infra", "local", "--cpus", "2", "sleep 120", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    waiting = page.locator("table", has=page.locator("caption", has_text="Tasks waiting for admission"))
    row = waiting.locator("tbody tr", has_text="held")
    expect(row).to_contain_text("quota")  # the page refreshes itself
    expect(row).to_contain_text("alice")
    expect(row).to_contain_text("cpu 2")
    queues = page.locator("table", has=page.locator("caption", has_text="Queues"))
    expect(queues.locator("tbody tr")).to_contain_text("0 / 1")
    # Its priority and what it is made of (`spz dispatch prio`), and the fairshare tree it comes from.
    held = next(p for p in plane.api.http.get("/api/v1/dispatch/queue", headers=plane.api.as_(plane.tokens["alice"]))
                .json()["pending"] if p["cluster"] == "held")
    assert held["factors"]["fairshare"] > 0 and held["priority"] >= int(held["factors"]["fairshare"]), held
    expect(row).to_contain_text(f"fairshare {held['factors']['fairshare']:.2f}".replace(".00", ""))
    share = page.locator("table", has=page.locator("caption", has_text="Fairshare tree (fair_tree)"))
    expect(share.locator("tbody tr", has_text="alice")).to_be_visible()
    tree = plane.api.http.get("/api/v1/dispatch/share", headers=plane.api.as_(plane.tokens["vera"])).json()
    alice = next(r for r in tree["rows"] if r["user"] == "alice")
    assert alice["account"] == "ml" and alice["raw_shares"] == 1 and tree["algorithm"] == "fair_tree", tree
    assert alice["fairshare"] * 10000 == pytest.approx(held["factors"]["fairshare"], abs=0.01), (alice, held)
    assert unlabelled_controls(page) == []

    editor.fill(_policy(4))
    page.get_by_role("button", name="Apply policy").click()
    expect(waiting).to_contain_text("no task waits")
    expect(queues.locator("tbody tr")).to_contain_text("2 / 4")
    budgets = page.locator("table", has=page.locator("caption", has_text="Budgets"))
    expect(budgets.locator("tbody tr")).to_contain_text("ml")
    shot(page, tmp_path, "dispatch")

    api, root = plane.api, plane.tokens["root"]

    def held_up() -> bool:
        r = api.http.get("/api/v1/clusters/held", headers=api.as_(root))
        return r.status_code == 200 and r.json().get("status") == "UP"

    wait_until("the admitted launch's cluster UP", held_up)
    stored = api.http.get("/api/v1/dispatch/policy", headers=api.as_(root)).json()
    assert stored["applied_by"] == "root" and "nominal: 4" in stored["yaml"], stored
    assert api.http.post("/api/v1/clusters/held/down", headers=api.as_(root)).status_code == 202
    assert api.http.delete("/api/v1/dispatch/policy", headers=api.as_(root)).status_code == 200


def test_the_console_endpoints_check_who_asks_and_what(plane: Any) -> None:
    """The endpoints the console added (services/api/routes_console.py), at the edge, over HTTP."""
    from api_harness import problem

    api, t = plane.api, plane.tokens
    _, vera, root = t["alice"], t["vera"], t["root"]
    problem(api.http.get("/api/v1/clusters/web/events"), 401)
    problem(api.http.get("/api/v1/clusters/nosuch/events", headers=api.as_(root)), 404)
    problem(api.http.get("/api/v1/clusters/web/events", headers=api.as_(root), params={"limit": 0}), 422)
    two = api.http.get("/api/v1/clusters/web/events", headers=api.as_(vera), params={"limit": 2}).json()["events"]
    every = api.http.get("/api/v1/clusters/web/events", headers=api.as_(root)).json()["events"]
    assert len(two) == 2 and two == every[-2:], (two, every[-2:])
    assert [e["seq"] for e in every] == sorted(e["seq"] for e in every), "oldest first"
    assert "cluster_terminated" in [e["type"] for e in every], every[-3:]
    assert all(not isinstance(v, (dict, list)) for e in every for v in e["summary"].values())
    problem(api.http.get("/api/v1/jobs/999/history", headers=api.as_(root)), 404)
    problem(api.http.get("/api/v1/users/bob/tokens", headers=api.as_(t["bob"])), 403)
    problem(api.http.get("/api/v1/users/nobody/tokens", headers=api.as_(root)), 404)
    problem(api.http.delete("/api/v1/users/bob/tokens/0123abcd", headers=api.as_(root)), 404)
    problem(api.http.delete("/api/v1/users/bob/tokens/not-hex", headers=api.as_(root)), 422)
    bobs = api.http.get("/api/v1/users/bob/tokens", headers=api.as_(root)).json()["tokens"]
    assert len(bobs) == 1 and t["bob"] not in json.dumps(bobs) and t["bob"].split("_")[1] == bobs[0]["token_id"]


def test_time_travel_shows_a_cluster_downed_later_as_up_before_its_down(plane: Any, open_as: Any,
                                                                        tmp_path: Path) -> None:
    """`?at=TIME`: cluster web (torn down by the cost test) is rebuilt from the log as it stood
    while its job ran: UP, its job RUNNING, nothing offered to act on; a bad or future time is a 422."""
    from datetime import datetime, timedelta, timezone

    from api_harness import problem

    api, alice, root = plane.api, plane.tokens["alice"], plane.tokens["root"]
    every = api.http.get("/api/v1/clusters/web/events", headers=api.as_(root)).json()["events"]
    started = datetime.fromisoformat(next(e["time"] for e in every if e["type"] == "job_started"))
    downed = datetime.fromisoformat(next(e["time"] for e in every if e["type"] == "down_requested"))
    at = (started + timedelta(seconds=1)).astimezone(timezone.utc)
    assert at < downed, (started, downed)
    at_text = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "web" not in [c["name"] for c in api.http.get("/api/v1/clusters", headers=api.as_(root)).json()["clusters"]]
    then = api.http.get("/api/v1/clusters", headers=api.as_(root), params={"at": at_text}).json()
    assert [(c["name"], c["status"], c["user"]) for c in then["clusters"]] == [("web", "UP", "alice")], then
    one = api.http.get("/api/v1/clusters/web", headers=api.as_(alice), params={"at": at_text}).json()
    assert one["status"] == "UP" and one["infra"] == "local" and one["owner"]["user"] == "alice", one
    jobs = api.http.get("/api/v1/clusters/web/jobs", headers=api.as_(alice), params={"at": at_text}).json()["jobs"]
    assert [(j["job_id"], j["status"]) for j in jobs] == [(1, "RUNNING")], jobs
    past = api.http.get("/api/v1/clusters/web/events", headers=api.as_(alice), params={"at": at_text}).json()
    assert "cluster_terminated" not in [e["type"] for e in past["events"]] and past["events"][-1]["seq"] < every[-1]["seq"]
    for bad in ("yesterday", (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat(), "1999-12-31T00:00:00Z"):
        body = problem(api.http.get("/api/v1/clusters", headers=api.as_(root), params={"at": bad}), 422)
        assert body["detail"].startswith("at: "), body
    problem(api.http.get("/api/v1/clusters/web", headers=api.as_(root), params={"at": "2001-01-01T00:00:00Z"}), 404)

    page, _ = open_as(None)  # signed in on the past page itself: nothing of "now" is in flight when it opens
    page.goto(f"{api.url}/console/?at={at_text}#/overview")
    page.get_by_label("API token").fill(alice)
    page.get_by_label("API token").press("Enter")
    expect(page.get_by_role("status").filter(has_text="Time travel")).to_contain_text(at_text)
    row = page.locator("table", has=page.locator("caption", has_text="Clusters")).locator("tr", has_text="web")
    expect(row).to_contain_text("UP")
    shot(page, tmp_path, "timetravel")
    row.get_by_role("link", name="web").click()
    expect(page.get_by_role("heading", name="Cluster web")).to_be_visible()
    expect(page.locator("dl.facts")).to_contain_text("UP")
    expect(page.locator("table", has=page.locator("caption", has_text="Jobs")).locator("tbody tr")).to_contain_text(
        "RUNNING")
    assert page.get_by_role("button", name="Down").count() == 0 and page.get_by_role("button", name="Cancel job 1").count() == 0
    expect(page.locator("#timeline")).not_to_contain_text("cluster_terminated")
    page.get_by_role("link", name="Back to now").click()
    expect(page.locator("dl.facts")).to_contain_text("TERMINATED")


def test_the_dispatch_and_alert_endpoints_check_who_asks_and_what(plane: Any) -> None:
    """services/api/routes_dispatch.py at the edge, over HTTP: the policy is an admin's to change,
    a bad one is a 422 at its line and key with nothing published, a good one is published stamped
    with the admin; budgets are the team's; an alert on the log is listed until it is resolved."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from datetime import datetime, timezone

    from api_harness import problem

    from skypurza.services.api.routes_dispatch import MAX_POLICY_CHARS
    from skypurza.events import naming
    from skypurza.events.alert_events import AlertRaised, AlertResolved
    from skypurza.events.bus import Bus
    from skypurza.events.principal import stamped_principal

    api, t = plane.api, plane.tokens
    nats = f"nats://127.0.0.1:{plane.env['SKYPURZA_NATS_PORT']}"

    def run(coro: Any) -> Any:  # playwright's sync API holds this thread's event loop
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result(timeout=60)

    async def on_bus(event: Any = None) -> list:
        bus = await Bus.connect(nats, STAGE, source="/tests/console")
        try:
            if event is not None:
                await bus.publish(event)
            return [s async for s in bus.replay(filter_subject=naming.event_filter(STAGE, "dispatch", "*"))]
        finally:
            await bus.close()

    problem(api.http.get("/api/v1/dispatch/queue"), 401)
    problem(api.http.get("/api/v1/dispatch/share"), 401)
    body = problem(api.http.put("/api/v1/dispatch/policy", headers=api.as_(t["alice"]), json={"yaml": _policy(1)}), 403)
    assert "admins" in body["detail"]
    before = len(run(on_bus()))
    body = problem(api.http.put("/api/v1/dispatch/policy", headers=api.as_(t["root"]),
                                json={"yaml": _policy(1, "nominall")}), 422)
    assert body["problems"][0]["line"] == 10 and body["problems"][0]["key"].endswith("cpu.nominall"), body
    assert "nothing was applied" in body["detail"] and len(run(on_bus())) == before
    body = problem(api.http.put("/api/v1/dispatch/policy", headers=api.as_(t["root"]),
                                json={"yaml": "x" * (MAX_POLICY_CHARS + 1)}), 422)  # refused before any parse
    assert body["errors"][0]["field"] == "yaml", body
    assert api.http.put("/api/v1/dispatch/policy", headers=api.as_(t["root"]),
                        json={"yaml": _policy(3)}).status_code == 200
    stored = run(on_bus())
    assert stamped_principal(stored[-1].envelope) == ("root", "ml") and stored[-1].event.policy.queues[0].team == "ml"
    q = api.http.get("/api/v1/dispatch/queue", headers=api.as_(t["vera"])).json()
    assert q["policy"] and q["queues"][0]["quotas"][0]["nominal"] == 3, q
    budgets = api.http.get("/api/v1/budgets", headers=api.as_(t["alice"])).json()["budgets"]
    assert [(b["team"], b["limit_usd"], b["state"]) for b in budgets] == [("ml", 50.0, "ok")], budgets
    problem(api.http.delete("/api/v1/dispatch/policy", headers=api.as_(t["bob"])), 403)
    assert api.http.delete("/api/v1/dispatch/policy", headers=api.as_(t["root"])).json()["policy"] is None

    now = datetime.now(timezone.utc)
    run(on_bus(AlertRaised(key="cluster_idle:web", kind="cluster_idle", subject="web",
                                   summary="cluster web idle", raised_at=now)))
    alerts = api.http.get("/api/v1/alerts", headers=api.as_(t["alice"])).json()["alerts"]
    assert [(a["key"], a["summary"]) for a in alerts] == [("cluster_idle:web", "cluster web idle")], alerts
    assert api.http.get("/api/v1/alerts", headers=api.as_(t["vera"])).json()["alerts"] == []
    run(on_bus(AlertResolved(key="cluster_idle:web", kind="cluster_idle", subject="web", resolved_at=now)))
    assert api.http.get("/api/v1/alerts", headers=api.as_(t["alice"])).json()["alerts"] == []


def _on_plane(plane: Any, publish: list[Any] = (), samples: list[Any] = ()) -> None:
    """Events onto the plane's log and node samples onto core NATS, from a thread of its own
    (playwright's sync API holds this thread's event loop)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from skypurza.events import naming
    from skypurza.events.bus import Bus

    async def go() -> None:
        bus = await Bus.connect(f"nats://127.0.0.1:{plane.env['SKYPURZA_NATS_PORT']}", STAGE, source="/tests/console")
        try:
            for event in publish:
                await bus.publish(event)
            for sample in samples:
                await bus.nc.publish(naming.sample_subject(STAGE, sample.cluster, sample.rank),
                                     sample.model_dump_json().encode())
            await bus.nc.flush()
        finally:
            await bus.close()

    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, go()).result(timeout=60)


def _gpu_sample(ts: Any) -> Any:
    from skypurza.events.nodesample import GpuSample, NodeSample

    return NodeSample(cluster="gpubox", rank=0, ts=ts.isoformat(), cpu_pct=23.0, expected_gpus=2, gpu_source="dcgm", gpus=[
        GpuSample(index=0, name="NVIDIA H100 80GB HBM3", utilization_pct=87.0, memory_used_mib=40000.0,
                  memory_total_mib=81559.0, temperature_c=61.0, power_w=390.0, ecc_corrected_volatile=37),
        GpuSample(index=1, name="NVIDIA H100 80GB HBM3", utilization_pct=5.0, memory_used_mib=500.0,
                  memory_total_mib=81559.0, temperature_c=40.0, power_w=70.0)])


def test_the_observability_page_shows_gpus_goodput_and_a_health_finding_as_it_lands(plane: Any, open_as: Any,
                                                                                      tmp_path: Path) -> None:
    """GPU utilisation from the samples the GPU health manager keeps, goodput from the metrics
    service (one GPU busy for 10 s: 10 useful GPU-seconds), and a GpuUnhealthy published on the
    log while the page is open appears on it with its cluster drained; members and viewers are
    refused (403), nobody signed in is a 401, and a past moment has no finding made after it."""
    from datetime import datetime, timedelta, timezone

    from api_harness import problem

    from skypurza.events.health_events import GpuUnhealthy

    api, t = plane.api, plane.tokens
    for path in ("gpus", "goodput", "health"):
        problem(api.http.get(f"/api/v1/observability/{path}"), 401)
        for who in ("alice", "vera"):
            body = problem(api.http.get(f"/api/v1/observability/{path}", headers=api.as_(t[who])), 403)
            assert "for admins" in body["detail"], body
    problem(api.http.get("/api/v1/observability/health", headers=api.as_(t["root"]), params={"limit": 0}), 422)
    problem(api.http.get("/api/v1/observability/gpus", headers=api.as_(t["root"]), params={"cluster": "a b"}), 422)
    problem(api.http.get("/api/v1/observability/health", headers=api.as_(t["root"]), params={"at": "soon"}), 422)

    t0 = datetime.now(timezone.utc)
    _on_plane(plane, samples=[_gpu_sample(t0), _gpu_sample(t0 + timedelta(seconds=10))])

    def gpubox() -> list[dict]:
        rows = api.http.get("/api/v1/observability/gpus", headers=api.as_(t["root"])).json()["gpus"]
        return [r for r in rows if r["cluster"] == "gpubox" and r["sampled_at"] == (t0 + timedelta(seconds=10)).isoformat()]

    rows = wait_until("gpubox's last sample kept by the GPU health manager", gpubox, 20)
    assert [(r["gpu_index"], r["utilization_pct"], r["memory_total_mib"]) for r in rows] == \
        [(0, 87.0, 81559.0), (1, 5.0, 81559.0)], rows
    assert [(r["gpu_source"], r["ecc_corrected_volatile"]) for r in rows] == [("dcgm", 37), ("dcgm", None)], rows

    def useful() -> float:
        g = api.http.get("/api/v1/observability/goodput", headers=api.as_(t["root"])).json()
        return next((r["useful_s"] for r in g["team"] if r["key"] == "(none)"), 0.0)

    wait_until("gpubox's busy GPU credited", lambda: useful() >= 10.0, 20)
    assert useful() == 10.0  # ten seconds of GPU 0; GPU 1, at 5 %, was idle

    page, _ = open_as("root")
    page.get_by_role("link", name="Observability").click()
    expect(page.get_by_role("heading", name="Observability")).to_be_visible()
    gpus = page.locator("table", has=page.locator("caption", has_text="Each GPU's last sample"))
    expect(gpus.locator("tr", has_text="gpubox").first).to_contain_text("87 %")
    first = gpus.locator("tbody tr", has_text="gpubox").first.locator("td")
    expect(first.nth(8)).to_have_text("37")  # ECC corrected (DCGM's single-bit count)
    expect(first.nth(9)).to_have_text("dcgm")  # the GPU source
    expect(page.locator("svg.chart")).to_have_attribute("aria-label", re.compile("gpubox/0/gpu0 87 %"))
    by_team = page.locator("table", has=page.locator("caption", has_text="Goodput by team"))
    expect(by_team.locator("tr", has_text="(none)")).to_contain_text("10 GPU-s")
    expect(page.locator("#drained")).to_have_text("No cluster is drained.")
    before = datetime.now(timezone.utc)
    time.sleep(0.05)
    _on_plane(plane, publish=[GpuUnhealthy(cluster="gpubox", rank=0, gpu_index=0, rule="xid", severity="fatal",
                                           detail="GPU 0: Xid 79 (GPU has fallen off the bus)",
                                           evidence={"xid": 79}, detected_at=datetime.now(timezone.utc))])
    findings = page.locator("table", has=page.locator("caption", has_text="GPU health findings"))
    expect(findings.locator("tbody tr").first).to_contain_text("Xid 79 (GPU has fallen off the bus)")
    expect(findings.locator("tbody tr").first).to_contain_text("fatal")
    expect(page.locator("#drained")).to_have_text("Drained: gpubox")
    assert unlabelled_controls(page) == []
    shot(page, tmp_path, "observability")

    now = api.http.get("/api/v1/observability/health", headers=api.as_(t["root"]), params={"cluster": "gpubox"}).json()
    assert [(f["rule"], f["gpu_index"], f["drained"]) for f in now["findings"]] == [("xid", 0, True)], now
    assert now["drained_clusters"] == ["gpubox"]
    then = api.http.get("/api/v1/observability/health", headers=api.as_(t["root"]),
                        params={"at": before.isoformat()}).json()
    assert "gpubox" not in [f["cluster"] for f in then["findings"]] and then["at"] == before.isoformat(), then

    member, _ = open_as("alice")
    assert member.locator("#nav-observability").is_hidden()
    member.goto(api.url + "/console/#/observability")
    expect(member.get_by_role("status").filter(has_text="they are for admins")).to_be_visible()


def test_time_travel_on_a_managed_jobs_page_and_the_cost_page(plane: Any, open_as: Any, tmp_path: Path) -> None:
    """`?at=` on the managed job page: its history as the log stood before it succeeded (a prefix of
    today's, no cancel offered, no output followed); on the cost page: the ledger's rows up to that
    moment, nothing before the first launch, today's total at the end."""
    from datetime import datetime, timedelta, timezone

    from api_harness import problem

    api, alice, root = plane.api, plane.tokens["alice"], plane.tokens["root"]
    jobs = api.http.get("/api/v1/jobs", headers=api.as_(alice)).json()["jobs"]
    job_id = next(j["job_id"] for j in jobs if j["name"] == "hello")
    now = api.http.get(f"/api/v1/jobs/{job_id}/history", headers=api.as_(alice)).json()
    times = [datetime.fromisoformat(c["time"]) for c in now["changes"]]
    first = times[0]
    i_done = next(i for i, c in enumerate(now["changes"]) if c["status"] == "SUCCEEDED")
    done, before_done = times[i_done], times[i_done - 1]
    # Between the change before SUCCEEDED and SUCCEEDED, however fast the job ran (a fixed 0.3 s
    # before the end fell before the first change once the whole job took 0.11 s).
    at = before_done + (done - before_done) / 2
    assert first <= before_done < at < done, now["changes"]
    past = api.http.get(f"/api/v1/jobs/{job_id}/history", headers=api.as_(alice), params={"at": at.isoformat()}).json()
    n = len(past["changes"])
    assert 1 <= n < len(now["changes"]) and past["changes"] == now["changes"][:n], (past, now)
    assert past["status"] == past["changes"][-1]["status"] != "SUCCEEDED" and past["at"] == at.isoformat(), past
    assert (past["user"], past["team"], past["name"]) == ("alice", "ml", "hello"), past
    problem(api.http.get(f"/api/v1/jobs/{job_id}/history", params={"at": at.isoformat()}), 401)
    problem(api.http.get(f"/api/v1/jobs/{job_id}/history", headers=api.as_(alice), params={"at": "then"}), 422)
    problem(api.http.get(f"/api/v1/jobs/{job_id}/history", headers=api.as_(alice),
                         params={"at": (first - timedelta(seconds=30)).isoformat()}), 404)

    page, _ = open_as(None)  # signed in on the past page itself: nothing of "now" is in flight when it opens
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()  # its own read of /health is done
    page.goto(f"{api.url}/console/?at={at.isoformat().replace('+', '%2B')}#/job/{job_id}")
    page.get_by_label("API token").fill(alice)
    page.get_by_label("API token").press("Enter")
    expect(page.get_by_role("status").filter(has_text="Time travel")).to_be_visible()
    history = page.locator("table", has=page.locator("caption", has_text="Each status change"))
    expect(history.locator("tbody tr")).to_have_count(n)
    expect(page.locator("dl.facts")).to_contain_text(past["status"])
    assert page.get_by_role("button", name="Cancel managed job").count() == 0
    expect(page.locator("#log-state")).to_contain_text("not shown at a past moment")
    shot(page, tmp_path, "job-timetravel")

    def total(**params: str) -> int:
        r = api.http.get("/api/v1/cost-report", headers=api.as_(root), params={"by": "user", **params})
        assert r.status_code == 200, r.text
        return int(r.json()["total"]["billing_seconds"])  # the local infra is free: its seconds count

    def all_down() -> bool:
        r = api.http.get("/api/v1/clusters", headers=api.as_(root))
        return r.status_code == 200 and r.json()["clusters"] == []

    wait_until("every cluster down (nothing accrues while the reports are read)", all_down)
    web = api.http.get("/api/v1/clusters/web/events", headers=api.as_(root)).json()["events"]
    launched = datetime.fromisoformat(web[0]["time"])
    downed = datetime.fromisoformat(next(e["time"] for e in web if e["type"] == "down_requested"))
    middle = launched + (downed - launched) / 2
    assert total(at=(launched - timedelta(seconds=5)).isoformat()) == 0
    assert 0 < total(at=middle.isoformat()) <= total(at=datetime.now(timezone.utc).isoformat()) == total()
    problem(api.http.get("/api/v1/cost-report", headers=api.as_(root),
                         params={"at": middle.isoformat(), "until": "2026-12-01"}), 422)
    then = api.http.get("/api/v1/cost-report", headers=api.as_(root), params={"by": "user", "at": middle.isoformat()}).json()

    page, _ = open_as(None)
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto(f"{api.url}/console/?at={middle.isoformat().replace('+', '%2B')}#/cost")
    page.get_by_label("API token").fill(root)
    page.get_by_label("API token").press("Enter")
    page.get_by_label("Group by").select_option("user")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#total")).to_have_text(f"${then['total']['cost_usd']}")
    expect(page.locator("#main")).to_contain_text(f"({then['total']['billing_minutes']} billed minutes; all)")
    expect(page.get_by_label("Until")).to_be_disabled()
    expect(page.locator("#cost-at")).to_contain_text("the ledger's rows up to then")


def test_open_alerts_fold_by_occurrence() -> None:
    """A resolve ends the occurrence it names, not a later raise of the same key."""
    from datetime import datetime, timezone

    from skypurza.events.alert_events import AlertRaised, AlertResolved
    from skypurza.services.api.routes_dispatch import OpenAlerts

    at = datetime(2026, 12, 1, tzinfo=timezone.utc)
    board = OpenAlerts()
    board.apply(AlertRaised(key="k", kind="orphan", subject="a", occurrence=2, raised_at=at))
    board.apply(AlertResolved(key="k", kind="orphan", subject="a", occurrence=1, resolved_at=at))
    assert [a["occurrence"] for a in board.rows()] == [2]
    board.apply(AlertResolved(key="k", kind="orphan", subject="a", occurrence=2, resolved_at=at))
    assert board.rows() == []


def test_a_timeline_row_keeps_an_events_plain_fields_only() -> None:
    from skypurza.services.api.routes_console import MAX_SUMMARY_CHARS, summary

    row = summary({"job_id": 3, "status": "x" * 500, "task": {"run": "secret stuff"}, "nodes": [1], "ok": True,
                   "secrets_key": "k", "reason": None})
    assert row == {"job_id": 3, "status": "x" * MAX_SUMMARY_CHARS, "ok": True, "reason": None}
