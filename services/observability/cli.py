"""`spz observability dashboards -o DIR` and `spz top`: the observability package's CLI plugin
(the `skypurza.cli_plugins` entry point).

- `dashboards` writes the Grafana dashboards (dashboards.py, built in Python) as JSON files into
  DIR, one per dashboard; `-o json` lists them (file, uid, title, every panel's queries) on
  stdout and writes nothing.
- `top` is a live terminal view of the control plane (top.py gathers and shapes it; the view is
  rich's Live): clusters, running jobs, $/h now, GPU use, alerts firing. `q` or Ctrl-C ends it;
  `--once` prints one frame (`-o json`: its data) and exits, for scripts and tests.
"""

from __future__ import annotations

import json
import select
import sys
from pathlib import Path
from typing import Any

import typer

from skypurza.cli.context import fail, print_json

app = typer.Typer(help="Dashboards for Grafana over the /metrics families (docs/observability.md).",
                  no_args_is_help=True)


@app.command("dashboards")
def dashboards_command(
    out: str = typer.Option(..., "-o", "--output", metavar="DIR|json",
                            help="The directory to write the dashboards into (made if missing), or `json` to "
                                 "list them on stdout and write nothing (a directory named json: ./json)."),
) -> None:
    """The Grafana dashboards (spend, goodput, fleet: GPU health, placements, failovers, bus lag)
    as JSON files to import into Grafana; each asks for the Prometheus that scrapes /metrics."""
    from .dashboards import dashboards, grafana_json

    ds = dashboards()
    listing = [{"file": d.file_name, "uid": d.uid, "title": d.title, "panels": len(d.panels),
                "queries": [t.expr for p in d.panels for t in p.targets]} for d in ds]
    if out == "json":
        print_json(listing)
        return
    target = Path(out).expanduser()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for d in ds:
            (target / d.file_name).write_text(json.dumps(grafana_json(d), indent=2) + "\n")
    except OSError as exc:
        raise fail(f"cannot write the dashboards into {target}: {exc.strerror or exc}")
    for item in listing:
        typer.echo(f"{target / item['file']}  {item['title']} ({item['panels']} panels)")


def top_command(
    once: bool = typer.Option(False, "--once", help="Print one frame and exit (with -o json: its data)."),
    output: str = typer.Option("table", "-o", "--output", help="table or json (json needs --once)."),
    interval: float = typer.Option(2.0, "--interval", "-n", min=0.5, max=60.0, help="Seconds between refreshes."),
) -> None:
    """A live view of the control plane: clusters, running jobs, $/h now, GPU use, alerts firing.
    Press q or Ctrl-C to leave."""
    from skypurza.cli.context import check_output

    from . import top

    check_output(output)
    if output == "json" and not once:
        raise typer.BadParameter("-o json prints one frame: add --once", param_hint="-o/--output")
    try:
        if once:
            frame = gather_once()
            if output == "json":
                print_json(frame)
            else:
                from skypurza.cli.console import console as make_console

                make_console().print(top.render(frame))
            return
        live(interval)
    except top.NotAnswering as exc:
        raise fail(str(exc))
    except KeyboardInterrupt:
        sys.stdout.write("\n")


def gather_once() -> dict[str, Any]:
    from skypurza.cli.context import run_async, stage
    from skypurza.cli.control import connect_bus

    async def go() -> dict[str, Any]:
        bus = await connect_bus(stage(), "top")
        try:
            from . import top

            return await top.gather(bus)
        finally:
            await bus.close()

    return run_async(go())


def _quit_pressed(timeout: float) -> bool:
    """Wait up to `timeout` for a key on a terminal; True on q. Not a terminal: just wait."""
    if not sys.stdin.isatty():
        import time

        time.sleep(timeout)
        return False
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and sys.stdin.read(1).lower() == "q"


def live(interval: float) -> None:
    """Redraw every `interval` seconds until q or Ctrl-C; one bus connection for the session."""
    import asyncio
    from rich.live import Live

    from skypurza.cli.console import console as make_console
    from skypurza.cli.context import stage
    from skypurza.cli.control import connect_bus

    from . import top

    loop = asyncio.new_event_loop()
    bus = loop.run_until_complete(connect_bus(stage(), "top"))
    saved = None
    if sys.stdin.isatty():
        import termios
        import tty

        saved = termios.tcgetattr(sys.stdin)
        tty.setcbreak(sys.stdin.fileno())  # q without Enter; Ctrl-C still interrupts
    try:
        with Live(top.render(loop.run_until_complete(top.gather(bus))), console=make_console(), auto_refresh=False,
                  screen=False) as view:
            while not _quit_pressed(interval):
                view.update(top.render(loop.run_until_complete(top.gather(bus))), refresh=True)
    finally:
        if saved is not None:
            import termios

            termios.tcsetattr(sys.stdin, termios.TCSADRAIN, saved)
        loop.run_until_complete(bus.close())
        loop.close()


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="observability")
    root.command("top")(top_command)
