"""`spz dispatch queue|policy show|apply|check|clear` and `spz budgets`: the dispatch service's
CLI plugin (platform; joins `spz` through the `skypurza.cli_plugins` entry point). It also adds
the what-if commands (`share`, `prio`, cliwhatif.py) to the same `dispatch` sub-app.

Reads ask the dispatch service, which answers from the state it keeps current; with no service
running they fold the log themselves (services/dispatch/ask.py), the same view either way
(services/dispatch/reads.py). `policy apply` publishes DispatchPolicyApplied.
"""

from __future__ import annotations

import getpass
from typing import Any

import typer

from skypurza.cli.context import check_output, fail, print_json, run_async, stage


OUTPUTS = ("table", "json")


def _output(output: str) -> str:
    return check_output(output, OUTPUTS)


async def _read(query: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    from skypurza.cli.control import connect_bus

    from .ask import read

    bus = await connect_bus(stage())
    try:
        return await read(bus, query, params)
    finally:
        await bus.close()


QUEUE_KEYS = ("task_id", "cluster", "team", "user", "position", "priority", "submitted_seq", "request", "kind", "reason")


def queue_command(output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Pending tasks with why each waits and their priority (like `squeue --start`), in the order
    they are decided: highest priority first, then submission."""
    _output(output)
    view = run_async(_read("queue"))
    rows = [{k: p[k] for k in QUEUE_KEYS} for p in view["pending"]]
    if output == "json":
        print_json({"policy": view["policy"], "pending": rows,
                    "note": "ordered by priority (Slurm's multifactor), then submission (stream sequence)"})
        return
    if not view["policy"]:
        typer.echo("no dispatch policy: every submission is admitted at once")
    if not rows:
        typer.echo("no task waits for admission")
        return
    typer.echo(f"{'TASK':<38} {'CLUSTER':<20} {'TEAM':<12} {'USER':<12} {'PRIORITY':>10} REASON")
    for r in rows:
        typer.echo(f"{r['task_id']:<38} {r['cluster']:<20} {str(r['team'] or '-'):<12} {r['user'] or '-':<12} "
                   f"{r['priority']:>10} {r['reason']}")


class _Live:
    """`spz dispatch share` and `prio` without --tree / --explain: the dispatch service's view
    (the decayed usage of every UsageRecorded, the pending tasks), or the fold of the log's."""

    def share(self, algorithm: str | None, output: str) -> None:
        from .cliwhatif import print_share

        print_share(run_async(_read("share", {"algorithm": algorithm} if algorithm else None))["rows"], output)

    def prio(self, output: str) -> None:
        from .cliwhatif import print_table

        view = run_async(_read("queue"))
        rows = [{"task_id": p["task_id"], "cluster": p["cluster"], "team": p["team"], "user": p["user"],
                 "priority": p["priority"], **p["weighted"], "nice": p["nice"], "tres": p["tres"],
                 "factors": p["factors"]} for p in view["pending"]]
        if output == "json":
            print_json({"policy": view["policy"], "priority": view["priority"], "jobs": rows})
            return
        if not view["priority"]:
            typer.echo("no priority section in the dispatch policy: tasks are admitted in submission order")
        if not rows:
            typer.echo("no task waits for admission")
            return
        print_table(["TASK", "USER", "TEAM", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "QOS", "NICE", "TRES"],
                    [[r["task_id"], r["user"] or "-", str(r["team"] or "-"), str(r["priority"])]
                     + [f"{r[k]:.0f}" for k in ("age", "fairshare", "jobsize", "qos")]
                     + [str(r["nice"]), ",".join(f"{k}={v:.0f}" for k, v in r["tres"].items() if v)] for r in rows])


def _load(file: str):
    from .policy import PolicyError, load_policy_file  # pydantic: not on `spz --help`'s path

    try:
        return load_policy_file(file)
    except PolicyError as exc:
        raise fail(str(exc)) from None


def check_command(file: str = typer.Argument(..., help="The policy YAML file."),
                  output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Validate a policy file: every problem with its file, line, column and key."""
    from .policy import PolicyError, load_policy_file

    _output(output)
    try:
        policy = load_policy_file(file)
    except PolicyError as exc:
        if output == "json":
            print_json({"ok": False, "problems": [p.__dict__ for p in exc.problems]})
            raise typer.Exit(1) from None
        raise fail(str(exc)) from None
    if output == "json":
        print_json({"ok": True, "policy": policy.model_dump(mode="json")})
    else:
        typer.echo(f"{file}: ok ({len(policy.queues)} queues, {len(policy.cohorts)} cohorts, "
                   f"{len(policy.budgets)} budgets)")


async def _publish(event: Any) -> int:
    from skypurza.cli.control import connect_bus

    bus = await connect_bus(stage())
    try:
        ack = await bus.publish(event)
        return int(ack.seq)
    finally:
        await bus.close()


def apply_command(file: str = typer.Argument(..., help="The policy YAML file."),
                  output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Make a policy file the dispatch policy (validated first; nothing is published when it is not)."""
    from skypurza.events.dispatch_events import DispatchPolicyApplied

    _output(output)
    policy = _load(file)
    seq = run_async(_publish(DispatchPolicyApplied(policy=policy, source=file, applied_by=getpass.getuser())))
    if output == "json":
        print_json({"applied": True, "seq": seq, "source": file})
    else:
        typer.echo(f"dispatch policy from {file} applied (log sequence {seq})")


def clear_command(output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Remove the dispatch policy: every held task is admitted, new ones are placed at once."""
    from skypurza.events.dispatch_events import DispatchPolicyApplied

    _output(output)
    seq = run_async(_publish(DispatchPolicyApplied(policy=None, source="", applied_by=getpass.getuser())))
    if output == "json":
        print_json({"applied": True, "seq": seq, "policy": None})
    else:
        typer.echo(f"dispatch policy removed (log sequence {seq})")


async def _last_policy() -> Any:
    from skypurza.cli.control import connect_bus
    from skypurza.events import naming
    from skypurza.events.dispatch_events import POLICY_ID, DispatchPolicyApplied

    bus = await connect_bus(stage())
    try:
        return await bus.last_event(naming.event_subject(bus.stage, DispatchPolicyApplied.AGGREGATE, POLICY_ID,
                                                         DispatchPolicyApplied.EVENT_NAME))
    finally:
        await bus.close()


def show_command(output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """The active dispatch policy, where it came from and who applied it."""
    import yaml

    _output(output)
    last = run_async(_last_policy())
    ev = last.event if last is not None else None
    policy = ev.policy.model_dump(mode="json", exclude_defaults=True) if ev is not None and ev.policy else None
    if output == "json":
        print_json({"policy": policy, "source": ev.source if ev else None, "applied_by": ev.applied_by if ev else None,
                    "seq": last.seq if last is not None else None})
    elif policy is None:
        typer.echo("no dispatch policy: every submission is admitted at once")
    else:
        typer.echo(f"# from {ev.source or '?'}, applied by {ev.applied_by or '?'} (log sequence {last.seq})")
        typer.echo(yaml.safe_dump(policy, sort_keys=False).rstrip())


def budgets_command(output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Every budget of the policy: spent so far this period, the limit, and when it runs out."""
    _output(output)
    rows = run_async(_read("budgets"))["budgets"]
    if output == "json":
        print_json({"budgets": rows})
        return
    if not rows:
        typer.echo("no budgets in the dispatch policy")
        return
    typer.echo(f"{'WHO':<24} {'PERIOD':<10} {'SPENT':>12} {'LIMIT':>12} {'STATE':<9} RUNS OUT")
    for r in rows:
        who = r["team"] + (f"/{r['user']}" if r["user"] else "")
        typer.echo(f"{who:<24} {r['period_key']:<10} {r['spent_usd']:>12,.2f} {r['limit_usd']:>12,.2f} "
                   f"{r['state']:<9} {r['runs_out_at'] or '-'}")


def register(app: typer.Typer) -> None:
    """The `skypurza.cli_plugins` entry point: `spz dispatch ...` (with the what-if commands)
    and `spz budgets`."""
    dispatch_app = typer.Typer(name="dispatch", help="Dispatch: admission by quotas and budgets, fairshare, "
                               "priority.", no_args_is_help=True)
    dispatch_app.command("queue")(queue_command)
    policy_app = typer.Typer(name="policy", help="The dispatch policy: show, check, apply, clear.",
                             no_args_is_help=True)
    policy_app.command("show")(show_command)
    policy_app.command("check")(check_command)
    policy_app.command("apply")(apply_command)
    policy_app.command("clear")(clear_command)
    dispatch_app.add_typer(policy_app, name="policy")
    from .cliwhatif import register_whatif

    register_whatif(dispatch_app, _Live())
    app.add_typer(dispatch_app, name="dispatch")
    app.command("budgets")(budgets_command)
