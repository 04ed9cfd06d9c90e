"""`spz dispatch share --tree FILE` and `spz dispatch prio --explain FILE`: Slurm's fairshare
(`sshare -l`) and multifactor priority (`sprio -l`) on given data, for policy authors.

`register_whatif(dispatch_app)` adds both commands to the `dispatch` sub-app (the dispatch
service's CLI calls it); `register(app)` is the CLI plugin entry point used until that sub-app
exists, and makes one of its own. A bad file is one `error:` line naming the file, the key and
what is accepted (exit 2), never a traceback.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

import json
import sys

import typer

from . import fairshare

# No import of skypurza.cli here: only the module an entry point names (cli.py) may import the
# CLI's helpers (tests/test_architecture.py), so these few are this module's own.
OUTPUTS = ("table", "json")


def check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise typer.BadParameter(f"{output!r}; accepted: {', '.join(OUTPUTS)}", param_hint="-o/--output")


def fail(message: str, code: int = 1) -> typer.Exit:
    """`error: <message>` on stderr as one line, and the Exit to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    for line in [columns, *rows]:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip())

LIVE_NOT_YET = ("the live form (over the log's decayed usage) is not available here; give {flag} FILE for the "
                "what-if form")


class Live(Protocol):
    """The live forms (cli.py: over the fold of the log), without --tree / --explain."""

    def share(self, algorithm: str | None, output: str) -> None: ...

    def prio(self, output: str) -> None: ...


_live: list[Live] = []  # set by register_whatif


def _num(v: Any, digits: int = 6) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    return f"{v:.{digits}f}"


def share_command(
    tree: Optional[str] = typer.Option(None, "--tree", metavar="FILE",
                                       help="A JSON tree of accounts and users with shares and usage (what-if)."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", help="fair_tree (Slurm's default) or classic "
                                            "(PriorityFlags=NO_FAIR_TREE); live: the policy's."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """Fairshare per association, like `sshare -l`: RawShares, NormShares, RawUsage, NormUsage,
    EffectvUsage, FairShare, LevelFS (docs/dispatch.md, *Fairshare*)."""
    check_output(output)
    if algorithm is not None and algorithm not in fairshare.ALGORITHMS:
        raise typer.BadParameter(f"{algorithm!r}; accepted: {', '.join(fairshare.ALGORITHMS)}",
                                 param_hint="--algorithm")
    if tree is None:
        if not _live:
            raise fail(LIVE_NOT_YET.format(flag="--tree"))
        return _live[0].share(algorithm, output)
    algorithm = algorithm or "fair_tree"
    from .whatif import WhatIfError, parse_tree, read_json, share_rows

    try:
        rows = share_rows(parse_tree(read_json(tree), tree), algorithm)
    except WhatIfError as exc:
        raise fail(str(exc), 2)
    print_share(rows, output)


def print_share(rows: list[dict[str, Any]], output: str) -> None:
    if output == "json":
        print_json(rows)
        return
    print_table(["ACCOUNT", "USER", "RAWSHARES", "NORMSHARES", "RAWUSAGE", "NORMUSAGE", "EFFECTVUSAGE", "FAIRSHARE",
                 "LEVELFS"],
                [[("  " * (r["path"].count("/") - 1)) + r["account"], r["user"] or "", str(r["raw_shares"]),
                  _num(r["norm_shares"]), str(int(r["raw_usage"])), _num(r["norm_usage"]), _num(r["effectv_usage"]),
                  _num(r["fairshare"]), _num(r["level_fs"])] for r in rows])


def prio_command(
    explain: Optional[str] = typer.Option(None, "--explain", metavar="FILE",
                                          help="A JSON file of weights and factors (what-if)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json."),
) -> None:
    """A job's priority, like `sprio -l`: each factor weighted and the integer Slurm would show
    (docs/dispatch.md, *Priority*)."""
    check_output(output)
    if explain is None:
        if not _live:
            raise fail(LIVE_NOT_YET.format(flag="--explain"))
        return _live[0].prio(output)
    from .whatif import WhatIfError, parse_explain, read_json
    from .whatif import explain as explain_of

    try:
        result = explain_of(*parse_explain(read_json(explain), explain))
    except WhatIfError as exc:
        raise fail(str(exc), 2)
    if output == "json":
        print_json(result)
        return
    tres = ",".join(f"{k}={v:.0f}" for k, v in result["tres"].items() if v)
    print_table(["PRIORITY", "SITE", "AGE", "ASSOC", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS", "NICE", "TRES"],
                [[str(result["priority"]), str(result["site"])]
                 + [f"{result[k]:.0f}" for k in ("age", "assoc", "fairshare", "jobsize", "partition", "qos")]
                 + [str(result["nice"]), tres]])


def register_whatif(dispatch_app: typer.Typer, live: Live | None = None) -> None:
    """Add `share` and `prio` to the `spz dispatch` sub-app (with `live`: their live forms)."""
    if live is not None:
        _live[:] = [live]
    dispatch_app.command("share")(share_command)
    dispatch_app.command("prio")(prio_command)


def register(app: typer.Typer) -> None:
    """The CLI plugin entry point while the dispatch service's own CLI does not exist: a
    `dispatch` sub-app with the what-if commands."""
    dispatch_app = typer.Typer(help="Dispatch: fairshare and priority (Slurm's semantics).", no_args_is_help=True)
    register_whatif(dispatch_app)
    app.add_typer(dispatch_app, name="dispatch")
