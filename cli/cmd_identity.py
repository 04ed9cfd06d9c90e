"""`spz users add|list|token|remove` and `spz teams add|list|update|remove|add-member|remove-member`:
who may use the API server, and in which teams (workspaces).

On the embedded control plane they publish the identity events (events/identity_events.py)
through the bus like every other verb; the OS user running `spz` is the admin there. Changes
are made with optimistic concurrency (services/api/directory_io.py): two `spz users add alice`
at once make one alice. With an API server configured (`spz api login`) they go through its
identity routes instead (cli/via_api_identity.py; an admin's token). A token is printed once, by
the command that makes it, and is on no log.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from .context import check_output, fail, print_json, run_async, stage

users = typer.Typer(name="users", help="Users of the API server: their teams, role and token.", no_args_is_help=True)
teams = typer.Typer(name="teams", help="Teams (SkyPilot's workspaces): allowed infras and default labels.",
                    no_args_is_help=True)

MAX_INFRAS = 64
_ROLES = ("admin", "member", "viewer")


def _name(value: str, what: str) -> str:
    from skypurza.events.naming import check_principal_name

    try:
        return check_principal_name(value, what)
    except ValueError as exc:  # one line, exit 2 (a usage error), like a bad flag
        raise fail(str(exc), 2) from None


def _user_arg(value: str) -> str:
    return _name(value, "user name")


def _team_value(value: Optional[str]) -> Optional[str]:
    return None if value is None else _name(value, "team name")


def _team_values(values: Optional[list[str]]) -> list[str]:
    return list(dict.fromkeys(_name(v, "team name") for v in values or []))


_TEAM_ROLES = ("member", "viewer")  # a role in one team; admin is deployment-wide


def _team_role(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in _TEAM_ROLES:
        raise typer.BadParameter(f"{value!r}; accepted: {', '.join(_TEAM_ROLES)} (admin is deployment-wide: "
                                 "spz users add NAME --role admin)")
    return value


def _role(value: str) -> str:
    if value not in _ROLES:
        raise typer.BadParameter(f"{value!r}; accepted: {', '.join(_ROLES)}")
    return value


def _server() -> Any:
    """The configured API server's transport, or None (the embedded bus)."""
    from .transport import api

    return api()


async def _with_bus(source: str, work: Any) -> Any:
    from skypurza.services.api.directory_io import IdentityError

    from .control import connect_bus

    bus = await connect_bus(stage(), source)
    try:
        return await work(bus)
    except IdentityError as exc:
        raise fail(str(exc))
    finally:
        await bus.close()


def _token_note(name: str) -> str:
    return (f"The token of {name}, shown this once (it is stored hashed; a lost one is replaced with "
            f"spz users token {name}):")


# ------------------------------------------------------------------------------------------- users

@users.command("add")
def users_add(
    name: str = typer.Argument(..., callback=_user_arg, help="The user's name (lower-case letters, digits, - _)."),
    team: list[str] = typer.Option(..., "--team", callback=_team_values,
                                   help="A team of the user's (spz teams add); repeat for several: the first is "
                                        "their primary team, the workspace a submission without -w runs in."),
    role: str = typer.Option("member", "--role", callback=_role, help="admin, member or viewer."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (the token is in it once)."),
) -> None:
    """Add a user to one team or several with a role, and print their first token once."""
    check_output(output)
    t = _server()
    if t is not None:
        from . import via_api_identity

        token_id, token = via_api_identity.add_user(t, name, team, role)
    else:
        from skypurza.services.api.directory_io import add_user

        issued = run_async(_with_bus("users", lambda bus: add_user(bus, name, team[0], role,  # type: ignore[arg-type]
                                                                   team[1:])))
        token_id, token = issued.token_id, issued.token
    if output == "json":
        print_json({"user": name, "team": team[0], "teams": team, "role": role, "token_id": token_id, "token": token})
        return
    typer.echo(f"Added user {name} to team{'s' if len(team) > 1 else ''} {', '.join(team)} as {role}.", err=True)
    typer.echo(_token_note(name), err=True)
    typer.echo(token)


@users.command("list")
def users_list(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Every user: teams (the primary first), role in each, live tokens (ids only)."""
    check_output(output)
    t = _server()
    if t is not None:
        from . import via_api_identity

        rows = via_api_identity.user_rows(t)
    else:
        from skypurza.services.api.directory_io import load_directory

        d = run_async(_with_bus("users", load_directory))
        rows = [{"user": u.name, "team": u.team, "teams": list(u.teams), "role": u.primary_role, "roles": u.roles,
                 "tokens": sorted(tok.token_id for tok in u.tokens.values()),
                 "service_account_tokens": sorted(tok.token_id for tok in u.tokens.values() if tok.service_account)}
                for u in sorted(d.users.values(), key=lambda u: u.name)]
    if output == "json":
        print_json(rows)
        return
    from .tables import print_table

    print_table(["USER", "TEAM", "ROLE", "TOKENS"],
                [[r["user"], ", ".join(r["teams"]), _roles_cell(r), str(len(r["tokens"]))] for r in rows])


def _roles_cell(row: dict[str, Any]) -> str:
    """One role when it is the same in every team of theirs, else each team's (`ml: member, cv: viewer`)."""
    roles = row.get("roles") or {}
    if len(set(roles.values())) <= 1:
        return str(row["role"])
    return ", ".join(f"{team}: {role}" for team, role in roles.items())


@users.command("token")
def users_token(
    name: str = typer.Argument(..., callback=_user_arg, help="The user."),
    service_account: bool = typer.Option(False, "--service-account",
                                         help="An extra token for a program; the user's own token stays."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (the token is in it once)."),
) -> None:
    """A new token for a user, printed once; their old token is revoked (not with --service-account)."""
    check_output(output)
    t = _server()
    if t is not None:
        from . import via_api_identity

        token_id, token = via_api_identity.new_token(t, name, service_account)
    else:
        from skypurza.services.api.directory_io import reissue_token

        issued = run_async(_with_bus("users", lambda bus: reissue_token(bus, name, service_account)))
        token_id, token = issued.token_id, issued.token
    if output == "json":
        print_json({"user": name, "token_id": token_id, "token": token, "service_account": service_account})
        return
    typer.echo(("A service-account token" if service_account else "A new token; the old one is revoked.")
               + " " + _token_note(name), err=True)
    typer.echo(token)


@users.command("remove")
def users_remove(name: str = typer.Argument(..., callback=_user_arg, help="The user.")) -> None:
    """Remove a user; every token of theirs stops working at once."""
    t = _server()
    if t is not None:
        from . import via_api_identity

        via_api_identity.remove_user(t, name)
    else:
        from skypurza.services.api.directory_io import remove_user

        run_async(_with_bus("users", lambda bus: remove_user(bus, name)))
    typer.echo(f"Removed user {name}; their tokens no longer work.")


# ------------------------------------------------------------------------------------------- teams

def _infras(values: Optional[list[str]]) -> list[str]:
    import re

    out = []
    for v in values or []:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_./-]{0,127}", v):
            raise typer.BadParameter(f"{v[:70]!r}: an infra like aws, aws/us-east-1 or local", param_hint="--infra")
        out.append(v)
    if len(out) > MAX_INFRAS:
        raise typer.BadParameter(f"{len(out)} infras; at most {MAX_INFRAS}", param_hint="--infra")
    return out


def _labels(values: Optional[list[str]]) -> dict[str, str]:
    import re

    from skypurza.events import limits

    out: dict[str, str] = {}
    for v in values or []:
        key, sep, value = v.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,62}", key) or len(value) > 256:
            raise typer.BadParameter(f"{v[:70]!r}: expected KEY=VALUE (a key of letters, digits, _ . / -, a value "
                                     "of at most 256 characters)", param_hint="--label")
        out[key] = value
    if len(out) > limits.MAX_LABELS:
        raise typer.BadParameter(f"{len(out)} labels; at most {limits.MAX_LABELS}", param_hint="--label")
    return out


def _infra_list(infra: Optional[list[str]], allowed: Optional[str]) -> list[str]:
    """`--infra` (repeated) and `--allowed-infras a,b` (SkyPilot's comma list) together."""
    values = list(infra or []) + [v.strip() for v in (allowed or "").split(",") if v.strip()]
    return list(dict.fromkeys(_infras(values)))


_ALLOWED_HELP = "Comma-separated infras its users may run on (aws,local; aws/us-east-1 for one region)."
_AWS_PROFILE_HELP = ("A named profile of the server's AWS credentials/config files: the team's EC2 clusters are "
                     "made with it (a reference, never a secret); unset: the server's default credentials.")


_K8S_NAMESPACE_HELP = ("The Kubernetes namespace the team's pods, Services and Secrets go in (an RFC 1123 label); "
                       "unset: each kubeconfig context's own namespace.")


_SLURM_ACCOUNT_HELP = ("The Slurm account the team's allocations are charged to (sbatch --account, over the "
                       "cluster's sbatch_options); unset: those options decide.")


def _credential(value: Optional[str], check_name: str, flag: str, *, clearing: bool = False) -> Optional[str]:
    """A credentials flag's value checked by events/team_credentials.py's `check_name` (exit 2 with
    the rule, naming `flag`); '' clears it on update."""
    if value is None or (clearing and value == ""):
        return value
    from skypurza.events import team_credentials

    try:
        return getattr(team_credentials, check_name)(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None


@teams.command("add")
def teams_add(
    name: str = typer.Argument(..., help="The team's name (lower-case letters, digits, - _)."),
    infra: Optional[list[str]] = typer.Option(None, "--infra", help="An infra its users may run on (repeat); "
                                                                     "none: every infra."),
    allowed_infras: Optional[str] = typer.Option(None, "--allowed-infras", help=_ALLOWED_HELP + " None: every infra."),
    label: Optional[list[str]] = typer.Option(None, "--label", help="KEY=VALUE, a label its tasks get (repeat)."),
    aws_profile: Optional[str] = typer.Option(None, "--aws-profile", help=_AWS_PROFILE_HELP),
    k8s_namespace: Optional[str] = typer.Option(None, "--k8s-namespace", help=_K8S_NAMESPACE_HELP),
    slurm_account: Optional[str] = typer.Option(None, "--slurm-account", help=_SLURM_ACCOUNT_HELP),
) -> None:
    """Add a team (a workspace): where its users may run, the labels its tasks get, its AWS profile,
    Kubernetes namespace and Slurm account."""
    name = _name(name, "team name")
    infras, labels = _infra_list(infra, allowed_infras), _labels(label)
    profile = _credential(aws_profile, "check_aws_profile", "--aws-profile")
    namespace = _credential(k8s_namespace, "check_k8s_namespace", "--k8s-namespace")
    account = _credential(slurm_account, "check_slurm_account", "--slurm-account")
    t = _server()
    if t is not None:
        from . import via_api_identity

        via_api_identity.add_team(t, name, infras, labels, profile, namespace, account)
    else:
        from skypurza.events.team_credentials import with_aws_profile, with_k8s_namespace, with_slurm_account
        from skypurza.services.api.directory_io import add_team

        creds = with_slurm_account(with_k8s_namespace(with_aws_profile(None, profile), namespace), account)
        run_async(_with_bus("teams", lambda bus: add_team(bus, name, infras, labels, creds)))
    typer.echo(f"Added team {name}" + (f" (infras: {', '.join(infras)})" if infras else "")
               + (f" (AWS profile {profile})" if profile else "")
               + (f" (Kubernetes namespace {namespace})" if namespace else "")
               + (f" (Slurm account {account})" if account else "") + ".")


@teams.command("list")
def teams_list(output: str = typer.Option("table", "-o", "--output", help="table or json.")) -> None:
    """Every team: allowed infras, labels, members."""
    check_output(output)
    server = _server()
    if server is not None:
        from . import via_api_identity

        rows = via_api_identity.team_rows(server)
    else:
        from skypurza.services.api.directory_io import load_directory

        d = run_async(_with_bus("teams", load_directory))
        from skypurza.events.team_credentials import to_dict

        d = run_async(_with_bus("teams", load_directory))
        rows = [{"team": t.name, "allowed_infras": list(t.allowed_infras), "labels": dict(t.labels),
                 "credentials": to_dict(t.credentials), "users": d.members(t.name)}
                for t in sorted(d.teams.values(), key=lambda t: t.name)]
    if output == "json":
        print_json(rows)
        return
    from .tables import print_table

    print_table(["TEAM", "INFRAS", "LABELS", "CREDENTIALS", "USERS"],
                [[r["team"], ", ".join(r["allowed_infras"]) or "all",
                  ", ".join(f"{k}={v}" for k, v in r["labels"].items()) or "-",
                  _credentials_cell(r.get("credentials") or {}), str(len(r["users"]))] for r in rows])


def _credentials_cell(creds: dict[str, Any]) -> str:
    """`aws:ml-prod`, `k8s:ml`, `slurm:ml-gpu`, those given (`aws:ml-prod, k8s:ml`), or `default`."""
    aws, k8s, slurm = creds.get("aws") or {}, creds.get("kubernetes") or {}, creds.get("slurm") or {}
    cells = ([f"aws:{aws['profile']}"] if aws.get("profile") else []) + (
        [f"k8s:{k8s['namespace']}"] if k8s.get("namespace") else []) + (
        [f"slurm:{slurm['account']}"] if slurm.get("account") else [])
    return ", ".join(cells) or "default"


@teams.command("update")
def teams_update(
    name: str = typer.Argument(..., help="The team."),
    allowed_infras: Optional[str] = typer.Option(
        None, "--allowed-infras", help=_ALLOWED_HELP + " An empty value ('') allows every infra; unset: kept."),
    label: Optional[list[str]] = typer.Option(None, "--label", help="KEY=VALUE (repeat): the team's labels, all "
                                                                     "replaced; unset: kept."),
    clear_labels: bool = typer.Option(False, "--clear-labels", help="Remove every label of the team."),
    aws_profile: Optional[str] = typer.Option(
        None, "--aws-profile", help=_AWS_PROFILE_HELP + " An empty value ('') goes back to the default; unset: kept."),
    k8s_namespace: Optional[str] = typer.Option(
        None, "--k8s-namespace",
        help=_K8S_NAMESPACE_HELP + " An empty value ('') goes back to the context's own; unset: kept."),
    slurm_account: Optional[str] = typer.Option(
        None, "--slurm-account",
        help=_SLURM_ACCOUNT_HELP + " An empty value ('') goes back to the cluster's options; unset: kept."),
) -> None:
    """Replace a team's allowed infras, labels, AWS profile, Kubernetes namespace and/or Slurm
    account; each applies from the next task on (running clusters stay where they were made)."""
    name = _name(name, "team name")
    if (allowed_infras is None and label is None and not clear_labels and aws_profile is None
            and k8s_namespace is None and slurm_account is None):
        raise fail("nothing to change: give --allowed-infras, --label, --clear-labels, --aws-profile, "
                   "--k8s-namespace or --slurm-account", 2)
    infras = None if allowed_infras is None else _infra_list(None, allowed_infras)
    labels = {} if clear_labels else (None if label is None else _labels(label))
    profile = _credential(aws_profile, "check_aws_profile", "--aws-profile", clearing=True)
    namespace = _credential(k8s_namespace, "check_k8s_namespace", "--k8s-namespace", clearing=True)
    account = _credential(slurm_account, "check_slurm_account", "--slurm-account", clearing=True)
    t = _server()
    if t is not None:
        from . import via_api_identity

        now_infras, now_labels = via_api_identity.update_team(t, name, infras, labels, profile, namespace,
                                                              account)
    else:
        from skypurza.services.api.directory_io import update_team

        now_infras, now_labels = run_async(_with_bus("teams", lambda bus: update_team(bus, name, infras, labels,
                                                                                      profile,
                                                                                      k8s_namespace=namespace,
                                                                                      slurm_account=account)))
    typer.echo(f"Updated team {name}: infras {', '.join(now_infras) or 'all'}; labels "
               + (", ".join(f"{k}={v}" for k, v in now_labels.items()) or "none")
               + ("" if profile is None else f"; AWS profile {profile or 'the server default'}")
               + ("" if namespace is None else f"; Kubernetes namespace {namespace or 'the context default'}")
               + ("" if account is None else f"; Slurm account {account or 'the cluster default'}") + ".")


@teams.command("remove")
def teams_remove(name: str = typer.Argument(..., help="The team.")) -> None:
    """Remove a team; refused while users belong to it (it says who)."""
    name = _name(name, "team name")
    t = _server()
    if t is not None:
        from . import via_api_identity

        via_api_identity.remove_team(t, name)
    else:
        from skypurza.services.api.directory_io import remove_team

        run_async(_with_bus("teams", lambda bus: remove_team(bus, name)))
    typer.echo(f"Removed team {name}.")


def _membership_out(output: str, team: str, user: str, teams: tuple[str, ...], said: str) -> None:
    if output == "json":
        print_json({"team": team, "user": user, "teams": list(teams), "primary": teams[0]})
        return
    typer.echo(f"{said} {user}'s teams: {', '.join(teams)} (primary: {teams[0]}).")


@teams.command("add-member")
def teams_add_member(
    name: str = typer.Argument(..., help="The team."),
    user: str = typer.Argument(..., callback=_user_arg, help="The user (spz users list)."),
    primary: bool = typer.Option(False, "--primary", help="Make it the user's primary team: the workspace a "
                                                           "submission without -w runs in (and is billed to)."),
    role: Optional[str] = typer.Option(None, "--role", callback=_team_role,
                                       help="Their role in this team: member or viewer; unset: their own role."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Put a user in one more team: a workspace they may submit into with -w/--workspace."""
    check_output(output)
    name = _name(name, "team name")
    t = _server()
    if t is not None:
        from . import via_api_identity

        now = via_api_identity.add_member(t, name, user, primary, role)
    else:
        from skypurza.services.api.directory_io import add_member

        now = run_async(_with_bus("teams", lambda bus: add_member(bus, name, user, primary, role)))
    _membership_out(output, name, user, now, f"Added {user} to team {name}.")


@teams.command("remove-member")
def teams_remove_member(
    name: str = typer.Argument(..., help="The team."),
    user: str = typer.Argument(..., callback=_user_arg, help="The user."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Take a user out of a team; refused for their only team (a user is always in one)."""
    check_output(output)
    name = _name(name, "team name")
    t = _server()
    if t is not None:
        from . import via_api_identity

        now = via_api_identity.remove_member(t, name, user)
    else:
        from skypurza.services.api.directory_io import remove_member

        now = run_async(_with_bus("teams", lambda bus: remove_member(bus, name, user)))
    _membership_out(output, name, user, now, f"Removed {user} from team {name}.")


@teams.command("set-role")
def teams_set_role(
    name: str = typer.Argument(..., help="The team."),
    user: str = typer.Argument(..., callback=_user_arg, help="The user, one of the team's members."),
    role: str = typer.Argument(..., help="member or viewer: what they may do in this team (admin is "
                                         "deployment-wide)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Change a member's role in one team; their token stays, the next request is decided by it."""
    check_output(output)
    name = _name(name, "team name")
    if role not in _TEAM_ROLES:
        raise fail(f"{role[:40]!r} is not a role in a team: member or viewer (admin is deployment-wide: "
                   "spz users add NAME --role admin)", 2)
    t = _server()
    if t is not None:
        from . import via_api_identity

        roles = via_api_identity.set_role(t, name, user, role)
    else:
        from skypurza.services.api.directory_io import set_role

        roles = run_async(_with_bus("teams", lambda bus: set_role(bus, name, user, role)))
    if output == "json":
        print_json({"team": name, "user": user, "role": role, "roles": roles})
        return
    typer.echo(f"{user} is a {role} in team {name}. Their roles: "
               + ", ".join(f"{team}: {r}" for team, r in roles.items()) + ".")


def register(app: typer.Typer) -> None:
    app.add_typer(users, name="users")
    app.add_typer(teams, name="teams")
