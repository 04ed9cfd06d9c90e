"""`spz dispatch queue|policy show|apply|check|clear` and `spz budgets`: the dispatch service's
CLI plugin (platform; joins `spz` through the `skypurza.cli_plugins` entry point). It also adds
the what-if commands (`share`, `prio`, cliwhatif.py) to the same `dispatch` sub-app.

Answers come from the log itself (the service's own fold, services/dispatch/state.py), so they
work whether or not the service runs; `policy apply` publishes DispatchPolicyApplied.
"""

from __future__ import annotations

import getpass
from typing import Any

import typer

from skypurza.cli.context import check_output, fail, print_json, run_async, stage


OUTPUTS = ("table", "json")


def _output(output: str) -> str:
    return check_output(output, OUTPUTS)


async def _state() -> Any:
    from skypurza.cli.control import connect_bus

    from .service import load_state

    bus = await connect_bus(stage())
    try:
        return await load_state(bus)
    finally:
        await bus.close()


def queue_command(output: str = typer.Option("table", "-o", "--output", help="json or table.")) -> None:
    """Pending tasks with why each waits and their priority (like `squeue --start`), in the order
    they are decided: highest priority first, then submission."""
    from datetime import datetime, timezone

    _output(output)
    state = run_async(_state())
    ranked = state.ranked(datetime.now(timezone.utc))
    rows = []
    for i, r in enumerate(ranked, 1):
        p = state.pending[r.task_id]
        rows.append({"task_id": p.task_id, "cluster": p.cluster, "team": p.team, "user": p.user,
                     "position": i, "priority": r.priority, "submitted_seq": p.seq, "request": p.request,
                     "kind": state.held.get(p.task_id, ("", ""))[0],
                     "reason": state.held.get(p.task_id, ("", "not decided yet"))[1]})
    if output == "json":
        print_json({"policy": state.policy is not None, "pending": rows,
                    "note": "ordered by priority (Slurm's multifactor), then submission (stream sequence)"})
        return
    if state.policy is None:
        typer.echo("no dispatch policy: every submission is admitted at once")
    if not rows:
        typer.echo("no task waits for admission")
        return
    typer.echo(f"{'TASK':<38} {'CLUSTER':<20} {'TEAM':<12} {'USER':<12} {'PRIORITY':>10} REASON")
    for r in rows:
        typer.echo(f"{r['task_id']:<38} {r['cluster']:<20} {str(r['team'] or '-'):<12} {r['user'] or '-':<12} "
                   f"{r['priority']:>10} {r['reason']}")


class _Live:
    """`spz dispatch share` and `prio` without --tree / --explain: over the fold of the log
    (the decayed usage of every UsageRecorded, the pending tasks), as the service sees it."""

    def share(self, algorithm: str | None, output: str) -> None:
        from datetime import datetime, timezone

        from skypurza.events.dispatch_policy import PriorityConfig

        from . import order
        from .cliwhatif import print_share
        from .whatif import share_rows

        state = run_async(_state())
        cfg = (state.policy.priority if state.policy is not None else None) or PriorityConfig()
        usage = state.fs_usage.at(datetime.now(timezone.utc).timestamp())
        print_share(share_rows(order.share_tree(cfg, state.members, usage), algorithm or cfg.algorithm), output)

    def prio(self, output: str) -> None:
        from datetime import datetime, timezone

        from .cliwhatif import print_table

        state = run_async(_state())
        rows = []
        for r in state.ranked(datetime.now(timezone.utc)):
            p = state.pending[r.task_id]
            rows.append({"task_id": r.task_id, "cluster": p.cluster, "team": p.team, "user": p.user,
                         "priority": r.priority, **{k: r.weighted.get(k, 0.0) for k in ("age", "fairshare", "jobsize",
                                                                                         "qos")},
                         "nice": r.nice, "tres": r.weighted_tres, "factors": r.factors})
        if output == "json":
            print_json({"policy": state.policy is not None,
                        "priority": state.policy is not None and state.policy.priority is not None, "jobs": rows})
            return
        if state.policy is None or state.policy.priority is None:
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
    from datetime import datetime, timezone

    from . import budgets as bd

    _output(output)
    state = run_async(_state())
    now = datetime.now(timezone.utc)
    rows = []
    for b in (state.policy.budgets if state.policy else []):
        st = bd.status(b, state.spend, now)
        rows.append({"team": st.team, "user": st.user, "period": st.period, "period_key": st.period_key,
                     "spent_usd": st.spent_usd, "limit_usd": st.limit_usd, "fraction": st.fraction,
                     "state": st.state, "hard": st.hard, "on_limit": b.on_limit,
                     "resets_at": st.resets_at.isoformat(), "runs_out_at": st.runs_out_at.isoformat() if st.runs_out_at else None})
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
