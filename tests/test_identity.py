"""Identity, pure: the directory folded from the identity events, tokens, authentication and the
roles' rules (services/api/identity.py), and the name check at the edge (events/naming.py)."""

from __future__ import annotations

import pytest

from skypurza.events.envelope import decode, make_envelope
from skypurza.events.identity_events import TeamAdded, TeamRemoved, TokenIssued, TokenRevoked, UserAdded, UserRemoved
from skypurza.events.naming import check_principal_name
from skypurza.events.principal import stamp, stamped_principal
from skypurza.services.api.identity import ACTIONS, Directory, Principal, authenticate, authorize, issue_token


def _issued(user: str, token, service_account: bool = False) -> TokenIssued:
    return TokenIssued(user=user, token_id=token.token_id, token_sha256=token.sha256, service_account=service_account)


def test_a_token_finds_its_user_until_replaced_revoked_or_the_user_is_removed():
    first, second, robot = issue_token(), issue_token(), issue_token()
    events = [TeamAdded(team="ml", allowed_infras=["aws"], labels={"cost": "ml"}),
              UserAdded(user="alice", team="ml", role="member"), _issued("alice", first)]
    d = Directory.of(enumerate(events, 1))
    assert authenticate(d, first.token) == Principal("alice", "ml", "member", first.token_id, False, ("ml",), (("ml", "member"),))
    assert d.teams["ml"].allowed_infras == ("aws",) and d.members("ml") == ["alice"]
    assert d.seq_of("user", "alice") == 3 and d.seq_of("team", "ml") == 1 and d.seq_of("user", "bob") == 0

    # A wrong secret with the right id, a token of nobody, junk, nothing: no principal.
    forged = first.token[:-4] + ("AAAA" if not first.token.endswith("AAAA") else "BBBB")
    for presented in (forged, issue_token().token, "spz_nothing", "", None, "x" * 10_000):
        assert authenticate(d, presented) is None

    # A new personal token replaces the old one; a service-account token stands beside it.
    d.apply(_issued("alice", second), 4)
    d.apply(_issued("alice", robot, service_account=True), 5)
    assert authenticate(d, first.token) is None
    assert authenticate(d, second.token).token_id == second.token_id
    assert authenticate(d, robot.token).service_account is True
    d.apply(TokenRevoked(user="alice", token_id=robot.token_id, reason="leaked"), 6)
    assert authenticate(d, robot.token) is None and authenticate(d, second.token) is not None

    # A removed user's tokens are dead, and stay dead when the name is added again.
    d.apply(UserRemoved(user="alice"), 7)
    assert authenticate(d, second.token) is None and d.members("ml") == []
    d.apply(UserAdded(user="alice", team="ml", role="viewer"), 8)
    assert authenticate(d, second.token) is None
    # A token issued for nobody (a user not added) finds nobody; a team removed is gone.
    d.apply(_issued("ghost", issue_token()), 9)
    d.apply(TeamRemoved(team="ml"), 10)
    assert "ghost" not in d.users and "ml" not in d.teams and d.applied == {"team": 10, "user": 9}


def test_a_token_is_never_shown_by_repr_and_only_its_digest_is_an_event():
    token = issue_token()
    assert token.token not in repr(token) and token.token not in str(token)
    assert token.token.startswith(f"spz_{token.token_id}_") and len(token.token) < 128
    event = _issued("alice", token)
    assert token.token not in make_envelope(event, source="/t").to_json().decode()


def _p(role: str, user: str = "me", team: str = "ml") -> Principal:
    return Principal(user, team, role)  # type: ignore[arg-type]


@pytest.mark.parametrize("action", ACTIONS)
def test_an_admin_may_do_everything(action):
    assert authorize(_p("admin"), action, "other", "research").allowed


def test_a_member_acts_on_their_own_reads_everyones_and_sees_their_teams_logs():
    m = _p("member")
    assert authorize(m, "submit", "me", "ml").allowed and authorize(m, "act", "me", "ml").allowed
    assert authorize(m, "read", "other", "research").allowed  # -u lists everyone's, for reading
    assert authorize(m, "logs", "other", "ml").allowed and authorize(m, "secrets", "me", "ml").allowed
    for action, owner, team, why in (("act", "other", "ml", "other's; acting on another user's"),
                                     ("submit", "other", "ml", "submit as themselves"),
                                     ("logs", "other", "research", "another team's logs are for admins"),
                                     ("secrets", "other", "ml", "other's; another user's secrets are for admins"),
                                     ("manage", None, None, "for admins")):
        decision = authorize(m, action, owner, team)  # type: ignore[arg-type]
        assert not decision.allowed and why in decision.reason, (action, decision)


def test_a_viewer_reads_their_own_teams_and_nothing_else():
    v = _p("viewer")
    assert authorize(v, "read", "other", "ml").allowed and authorize(v, "logs", "other", "ml").allowed
    for action, team in (("submit", "ml"), ("act", "ml"), ("secrets", "ml"), ("read", "research"),
                         ("logs", "research"), ("manage", "ml")):
        decision = authorize(v, action, "other", team)  # type: ignore[arg-type]
        assert not decision.allowed and decision.reason, action
    assert "viewers read only" in authorize(v, "submit", "me", "ml").reason


@pytest.mark.parametrize("bad", ["a.b", "a*", "a>", "a/b", "a b", "Alice", "-lead", "", "a" * 64, "ok\n", 7])
def test_a_name_with_subject_or_path_metacharacters_is_refused_saying_what_is_accepted(bad):
    with pytest.raises(ValueError) as info:
        check_principal_name(bad, "user name")
    message = str(info.value)
    assert message.startswith("invalid user name") and "lower-case letters, digits, '-' or '_'" in message
    assert len(message) < 300  # a huge name is not echoed whole


def test_names_that_are_accepted():
    for good in ("alice", "ml-team", "svc_ci", "0", "a" * 63):
        assert check_principal_name(good) == good


def test_the_stamp_is_two_cloudevents_extension_attributes_that_survive_the_log():
    env = stamp(make_envelope(UserAdded(user="a", team="ml", role="member"), source="/api"), "alice", "ml")
    decoded = decode(env.to_json())
    assert decoded.status == "ok" and stamped_principal(decoded.envelope) == ("alice", "ml")
    assert stamped_principal(make_envelope(UserRemoved(user="a"), source="/cli")) is None


def test_a_listing_shows_what_the_caller_may_read_and_own_by_default():
    from skypurza.services.api.identity import Principal, visible

    rows = [{"name": "a1", "user": "alice", "team": "ml"}, {"name": "b1", "user": "bob", "team": "ml"},
            {"name": "c1", "user": "carol", "team": "ops"}]
    alice = Principal("alice", "ml", "member", "t1", False)
    vera = Principal("vera", "ml", "viewer", "t2", False)
    root = Principal("root", "admin", "admin", "t3", False)
    assert [r["name"] for r in visible(alice, rows, all_users=False)] == ["a1"]
    assert [r["name"] for r in visible(vera, rows, all_users=False)] == ["a1", "b1"]  # a viewer: the team's
    assert [r["name"] for r in visible(root, rows, all_users=False)] == ["a1", "b1", "c1"]
    assert [r["name"] for r in visible(alice, rows, all_users=True)] == ["a1", "b1", "c1"]  # -u: read everyone's
    assert [r["name"] for r in visible(vera, rows, all_users=True)] == ["a1", "b1"]  # a viewer: never another team
