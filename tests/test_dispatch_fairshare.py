"""Slurm's fairshare (services/dispatch/fairshare.py): classic against classic_fair_share.html's
five-user example (every number checked), Fair Tree against fair_tree.html's rules and the
source's tie handling, properties over generated trees, and `spz dispatch share --tree` run as
a real `spz` process (-o json and the positioned errors)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skypurza.services.dispatch import fairshare
from skypurza.services.dispatch.fairshare import Node
from skypurza.services.dispatch.whatif import WhatIfError, parse_tree, share_rows


def user(name: str, usage: float = 0.0, shares: int = 1) -> Node:
    return Node(name=name, shares=shares, usage=usage, user=True)


def acct(name: str, shares: int, *children: Node) -> Node:
    return Node(name=name, shares=shares, children=children,
                usage=math.fsum(c.usage for c in children))


# classic_fair_share.html, Figure 3: A=40 {B=30 {User1}, C=10 {User2, User3}}, D=60 {E=25 {User4},
# F=35 {User5}}; usage as a fraction of the machine: User1 .2, User2 .25, User4 .25.
# Erratum: the page normalises usage by the machine, so its usages add up to 0.7; Slurm divides
# by the root's RawUsage (every association's usage), so the page's numbers hold only when the
# other 0.3 was used elsewhere, here by root's own user (0 shares, so no level's shares change).
def classic_example() -> Node:
    return Node(name="root", children=(
        user("root", 30, shares=0),
        acct("A", 40, acct("B", 30, user("user1", 20)), acct("C", 10, user("user2", 25), user("user3", 0))),
        acct("D", 60, acct("E", 25, user("user4", 25)), acct("F", 35, user("user5", 0))),
    ))


def by_path(rows):
    return {r.path: r for r in rows}


def test_classic_reproduces_every_number_of_the_documented_example():
    rows = by_path(fairshare.compute(classic_example(), "classic"))
    norm_shares = {"/A/B/user1": 0.3, "/A/C/user2": 0.05, "/A/C/user3": 0.05, "/D/E/user4": 0.25, "/D/F/user5": 0.35,
                   "/A": 0.4, "/D": 0.6, "/A/B": 0.3, "/A/C": 0.1, "/D/E": 0.25, "/D/F": 0.35}
    for path, s in norm_shares.items():
        assert rows[path].norm_shares == pytest.approx(s, abs=1e-12), path
    effectv = {"/A": 0.45, "/D": 0.25, "/A/B": 0.3875, "/A/C": 0.3, "/D/E": 0.25, "/D/F": 0.1458,
               "/A/B/user1": 0.3875, "/A/C/user2": 0.275, "/A/C/user3": 0.15, "/D/E/user4": 0.25,
               "/D/F/user5": 0.1458}
    for path, ue in effectv.items():
        # the page rounds F's and User5's 0.145833... to 0.1458
        assert rows[path].effectv_usage == pytest.approx(ue, abs=5e-5), path
    factors = {"/A/B/user1": 0.408479, "/A/C/user2": 0.022097, "/A/C/user3": 0.125000, "/D/E/user4": 0.500000,
               "/D/F/user5": 0.749154}
    for path, f in factors.items():
        assert round(rows[path].fairshare, 6) == f, path
    # Erratum: the page prints 2**(-.1458/.35) = 0.749154, but that expression is 0.749203;
    # 0.749154 is 2**(-0.1458333.../0.35), the unrounded effective usage.
    assert round(2 ** (-0.1458 / 0.35), 6) == 0.749203
    assert rows["/D/F/user5"].fairshare > rows["/D/E/user4"].fairshare > rows["/A/B/user1"].fairshare
    # the page: "user 5's job would be granted the highest scheduling priority"
    users = [r for r in rows.values() if r.user and r.path != "/root"]
    assert max(users, key=lambda r: r.fairshare).path == "/D/F/user5"


def test_classic_dampening_divides_the_exponent():
    # Erratum: the refined formula F = 2^(-UE/S) on the page drops FairShareDampeningFactor,
    # which the source (priority_p_calc_fs_factor) still applies.
    rows = by_path(fairshare.compute(classic_example(), "classic", dampening=2))
    assert rows["/A/C/user2"].fairshare == pytest.approx(2 ** (-(0.275 / 0.05) / 2))


def test_fair_tree_level_quantities_and_ranking():
    rows = by_path(fairshare.compute(classic_example(), "fair_tree"))
    # NormShares and EffectvUsage are level-local in Fair Tree
    assert rows["/A/B"].norm_shares == pytest.approx(0.75)
    assert rows["/A/C/user2"].norm_shares == pytest.approx(0.5)
    assert rows["/A"].effectv_usage == pytest.approx(45 / 100)
    assert rows["/A/C/user2"].effectv_usage == pytest.approx(1.0)
    assert rows["/A/C/user2"].norm_usage == pytest.approx(0.25)  # still RawUsage / root's
    # LF = S/U: /root (S=0) 0; A 0.4/0.45; D 0.6/0.25; B 0.75/(20/45); C 0.25/(25/45)
    assert rows["/root"].level_fs == 0.0
    assert rows["/A"].level_fs == pytest.approx(0.4 / 0.45)
    assert rows["/D"].level_fs == pytest.approx(2.4)
    assert rows["/A/B"].level_fs == pytest.approx(1.6875)
    assert rows["/A/C"].level_fs == pytest.approx(0.45)
    assert math.isinf(rows["/D/F"].level_fs) and math.isinf(rows["/A/C/user3"].level_fs)
    # depth first, highest LF first: D (F: user5, E: user4), A (B: user1, C: user3, user2), root
    order = ["/D/F/user5", "/D/E/user4", "/A/B/user1", "/A/C/user3", "/A/C/user2", "/root"]
    n = len(order)
    for rank, path in zip(range(n, 0, -1), order):
        assert rows[path].fairshare == pytest.approx(rank / n), path
    assert rows["/A"].fairshare is None  # Fair Tree ranks users only


def test_fair_tree_children_of_a_higher_account_all_rank_higher():
    # fair_tree.html: root => Acct1 => Acct12 => UserA, root => Acct1 => Acct16 => UserB; UserB
    # has the higher FairShare exactly when Acct16 has the higher LevelFS.
    tree = Node(name="root", children=(acct("Acct1", 1, acct("Acct12", 1, user("UserA", 10), user("a2", 1)),
                                                     acct("Acct16", 1, user("UserB", 90), user("b2", 0))),))
    rows = by_path(fairshare.compute(tree, "fair_tree"))
    acct12, acct16 = rows["/Acct1/Acct12"], rows["/Acct1/Acct16"]
    assert acct12.level_fs > acct16.level_fs
    assert min(rows["/Acct1/Acct12/UserA"].fairshare, rows["/Acct1/Acct12/a2"].fairshare) > \
        max(rows["/Acct1/Acct16/UserB"].fairshare, rows["/Acct1/Acct16/b2"].fairshare)


def test_fair_tree_ties_follow_the_source():
    # Tied sibling users share a rank; the next user takes rank-no-ties.
    tree = Node(name="root", children=(user("u1", 10), user("u2", 10), user("u3", 30)))
    rows = by_path(fairshare.compute(tree, "fair_tree"))
    assert rows["/u1"].fairshare == rows["/u2"].fairshare == 1.0
    assert rows["/u3"].fairshare == pytest.approx(1 / 3)
    # A user tied with a sibling account sorts first; the account's first user gets its rank.
    tree = Node(name="root", children=(acct("acc", 1, user("x", 5), user("y", 0)), user("u", 5)))
    rows = by_path(fairshare.compute(tree, "fair_tree"))
    assert rows["/acc"].level_fs == rows["/u"].level_fs == 1.0
    assert rows["/u"].fairshare == 1.0
    assert rows["/acc/y"].fairshare == 1.0  # LF inf sorts first in acc, tied through the account
    assert rows["/acc/x"].fairshare == pytest.approx(1 / 3)
    # Erratum: the page says tied sibling accounts have their children merged before sorting.
    # The source never merges (_count_tied_accounts stops at the first account); the second
    # account's first user inherits the tie, the rest rank after the first account's users.
    tree = Node(name="root", children=(acct("a", 1, user("a1", 1), user("a2", 3)),
                                       acct("b", 1, user("b1", 0), user("b2", 4))))
    rows = by_path(fairshare.compute(tree, "fair_tree"))
    assert rows["/a"].level_fs == rows["/b"].level_fs == 1.0
    got = {p: rows[p].fairshare for p in ("/a/a1", "/a/a2", "/b/b1", "/b/b2")}
    # merged, b1 (LF inf) would rank first; unmerged: a1 (LF 2) 4/4, a2 3/4, b1 tied -> 3/4, b2 1/4
    assert got == {"/a/a1": 1.0, "/a/a2": 0.75, "/b/b1": 0.75, "/b/b2": 0.25}


def test_zero_shares_and_no_usage():
    tree = Node(name="root", children=(user("idle", 0, shares=0), user("busy", 5, shares=0), user("new", 0)))
    rows = by_path(fairshare.compute(tree, "fair_tree"))
    assert rows["/idle"].level_fs == 0.0 and rows["/busy"].level_fs == 0.0  # S = 0 gives 0, even with U = 0
    assert math.isinf(rows["/new"].level_fs)
    classic = by_path(fairshare.compute(tree, "classic"))
    assert classic["/idle"].fairshare == 0.0  # S <= 0: F = 0
    nothing = fairshare.compute(Node(name="root", children=(user("a"), user("b"))), "classic")
    assert [r.norm_usage for r in nothing] == [0.0, 0.0] and [r.fairshare for r in nothing] == [1.0, 1.0]


# ------------------------------------------------------------------ properties


@st.composite
def subtree(draw, prefix: str, depth: int) -> Node:
    kids = []
    for i in range(draw(st.integers(1, 4))):
        name = f"{prefix}{i}"
        if depth < 3 and draw(st.booleans()):
            sub = draw(subtree(name + "_", depth + 1))
            kids.append(Node(name=name, shares=draw(st.integers(0, 100)), children=sub.children, usage=sub.usage))
        else:
            kids.append(user(name, draw(st.sampled_from([0.0, 1.0, 2.5, 10.0, 1e6])), draw(st.integers(0, 100))))
    return Node(name="root", children=tuple(kids), usage=math.fsum(k.usage for k in kids))


def trees():
    return subtree("n", 0)


@settings(max_examples=200, deadline=None)
@given(trees(), st.sampled_from(fairshare.ALGORITHMS))
def test_fairshare_lies_in_0_1_and_users_with_more_usage_never_rank_higher(tree, algorithm):
    rows = fairshare.compute(tree, algorithm)
    for r in rows:
        assert 0.0 <= r.norm_usage <= 1.0 and 0.0 <= r.norm_shares <= 1.0
        if r.fairshare is not None:
            assert 0.0 <= r.fairshare <= 1.0
        if algorithm == "fair_tree":
            assert r.level_fs is not None and r.level_fs >= 0
            if r.user:
                assert r.fairshare is not None and r.fairshare > 0
    # two sibling users with equal shares: the one that used more never has the higher FairShare
    by_parent: dict[str, list] = {}
    for r in rows:
        if r.user:
            by_parent.setdefault(r.path.rsplit("/", 1)[0], []).append(r)
    for sibs in by_parent.values():
        for a in sibs:
            for b in sibs:
                if a.raw_shares == b.raw_shares > 0 and a.raw_usage > b.raw_usage:
                    assert a.fairshare <= b.fairshare


# ------------------------------------------------------------------ the what-if file and CLI

ISSUE_TREE = {"name": "root", "children": [
    {"name": "teama", "shares": 40, "usage": 91.5, "children": [{"name": "alice", "user": True, "shares": 1, "usage": 91.5}]},
    {"name": "teamb", "shares": 60, "children": [{"name": "bob", "user": True, "shares": 1, "usage": 0}]}]}


@pytest.mark.parametrize("tree, message", [
    ({"name": "root", "children": [{"name": "a", "shares": -3}]}, "children[0].shares: -3 is not accepted; accepted: a whole number from 0"),
    ({"name": "root", "children": [{"name": "a/b"}]}, "children[0].name: \"a/b\" is not accepted"),
    ({"name": "root", "children": [{"name": "a", "usage": 5, "children": [{"name": "x", "user": True, "usage": 4}]}]},
     "children[0].usage: 5 is not the sum of its children's usage (4)"),
    ({"name": "root", "children": [{"name": "a", "user": True}, {"name": "a", "user": True}]}, "children[1].name: 'a' appears twice"),
    ({"name": "root", "children": [{"name": "a", "sharez": 1}]}, "children[0].sharez: unknown key; accepted: name, shares"),
    ({"name": "root", "children": [{"name": "u", "user": True, "children": [{"name": "x"}]}]}, "children[0].children: a user has no children"),
    ([1, 2], "list is not accepted; accepted: an object"),
])
def test_a_bad_tree_names_the_key_and_what_is_accepted(tree, message):
    with pytest.raises(WhatIfError) as err:
        parse_tree(tree, "t.json")
    assert str(err.value).startswith("t.json")
    assert message in str(err.value)


def spz(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SKYPURZA_NO_PLUGINS", "SKYPURZA_DEBUG")}
    return subprocess.run([sys.executable, "-m", "skypurza.cli.main", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def test_spz_dispatch_share_tree_json(tmp_path):
    (tmp_path / "tree.json").write_text(json.dumps(ISSUE_TREE))
    res = spz("dispatch", "share", "--tree", "tree.json", "-o", "json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["path"]: r for r in json.loads(res.stdout)}
    assert list(rows) == ["/teama", "/teama/alice", "/teamb", "/teamb/bob"]
    assert rows["/teama"]["norm_shares"] == 0.4 and rows["/teama"]["level_fs"] == 0.4
    assert rows["/teama/alice"]["effectv_usage"] == 1.0 and rows["/teama/alice"]["fairshare"] == 0.5
    assert rows["/teamb"]["level_fs"] == "inf" and rows["/teamb/bob"]["level_fs"] == "inf"
    assert rows["/teamb/bob"]["fairshare"] == 1.0
    assert rows["/teama/alice"]["account"] == "teama" and rows["/teama/alice"]["user"] == "alice"
    classic = spz("dispatch", "share", "--tree", "tree.json", "--algorithm", "classic", "-o", "json", cwd=tmp_path)
    assert classic.returncode == 0, classic.stderr
    crow = {r["path"]: r for r in json.loads(classic.stdout)}
    assert crow["/teama/alice"]["fairshare"] == pytest.approx(2 ** (-1.0 / 0.4))
    assert crow["/teama/alice"]["level_fs"] is None


def test_spz_dispatch_share_bad_inputs_are_one_line(tmp_path):
    (tmp_path / "bad.json").write_text('{"name": "root", "children": [{"name": "a", "shares": "lots"}]}')
    (tmp_path / "broken.json").write_text('{"name": "root",\n  "children": [}')
    (tmp_path / "nan.json").write_text('{"name": "root", "children": [{"name": "a", "user": true, "usage": NaN}]}')
    for args, text in [
        (["--tree", "bad.json"], "bad.json: children[0].shares: \"lots\" is not accepted; accepted: a whole number"),
        (["--tree", "broken.json"], "broken.json:2:16: not valid JSON"),
        (["--tree", "nan.json"], "nan.json: NaN is not a number JSON allows"),
        (["--tree", "missing.json"], "missing.json: no such file"),
        (["--tree", "bad.json", "--algorithm", "fifo"], "accepted: fair_tree, classic"),
    ]:
        res = spz("dispatch", "share", *args, "-o", "json", cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert text in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and res.stdout == ""
