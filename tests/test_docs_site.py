"""The public docs site and its generated CLI reference.

`mkdocs build --strict` of the real mkdocs.yml must pass (a broken link, a missing anchor or a
page left out of the nav fails it, and a planted one is shown to), and docs/cli-reference.md
must be exactly what `python -m skypurza.cli.docgen` prints from every command's `--help`.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from skypurza.cli import docgen

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "cli-reference.md"
REGENERATE = "python -m skypurza.cli.docgen > docs/cli-reference.md"

# The pages issue 12 asks the site for, by file (what the nav must reach).
REQUIRED_PAGES = ("getting-started", "task-yaml", "cli-reference", "backend-local", "backend-aws",
                  "skypilot-migration", "troubleshooting")


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, timeout=120, cwd=config.parent)


def test_the_docs_site_builds_strict(tmp_path):
    res = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stderr, res.stderr
    for page in REQUIRED_PAGES:
        html = tmp_path / "site" / page / "index.html"
        assert html.exists(), f"{page}.md is not built into the site"
    assert "spz jobs launch" in (tmp_path / "site" / "cli-reference" / "index.html").read_text()


def test_a_broken_link_or_a_page_left_out_fails_the_build(tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    page = tmp_path / "docs" / "troubleshooting.md"
    page.write_text(page.read_text() + "\n[a](cli.md#no-such-anchor) [b](nope.md) [c](../cli/main.py)\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    res = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert res.returncode != 0
    for found in ("orphan.md", "'nope.md'", "'../cli/main.py'", "'#no-such-anchor'"):
        assert found in res.stderr, (found, res.stderr)


def test_the_cli_reference_is_generated_from_help():
    # The terminal and the environment must not change a byte: a narrow, coloured terminal, a
    # wide TERMINAL_WIDTH and the no-plugins switch (the reference is of spz as installed).
    env = {**os.environ, "COLUMNS": "40", "TERMINAL_WIDTH": "200", "FORCE_COLOR": "1", "SKYPURZA_NO_PLUGINS": "1"}
    res = subprocess.run([sys.executable, "-m", "skypurza.cli.docgen"], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    diff = list(difflib.unified_diff(REFERENCE.read_text().splitlines(), res.stdout.splitlines(),
                                     "docs/cli-reference.md", "--help now", lineterm="", n=1))
    assert not diff, f"docs/cli-reference.md is stale: {REGENERATE}\n" + "\n".join(diff[:60])


def test_the_cli_reference_has_every_command_whole_and_plain():
    from skypurza.cli.main import app

    text = REFERENCE.read_text()
    sections = dict(re.findall(r"^## `([^`]+)`[^\n]*\n\n```text\n(.*?)\n```$", text, flags=re.M | re.S))
    assert len(sections) == text.count("\n## "), "a section is not one heading and one text block"
    root = typer.main.get_command(app)
    walked = {" ".join(("spz", *entry.path)) for entry, _ in docgen.walk(root, root.make_context(
        "spz", [], resilient_parsing=True))}
    assert walked - set(sections) == set(), f"commands missing from docs/cli-reference.md: {REGENERATE}"
    # Sub-commands, the platform plugin's commands and the hidden ones are there too.
    assert {"spz jobs launch", "spz api serve", "spz cost-report", "spz ledger billing"} <= set(sections)
    assert "## `spz reconcile` *(hidden)*" in text
    assert "\x1b[" not in text, "colour codes in the reference"
    assert max(len(line) for block in sections.values() for line in block.splitlines()) <= docgen.WIDTH
    launch = sections["spz launch"]
    assert "--idle-minutes-to-autostop" in launch and "--env-file" in launch  # no flag name cut short
    assert "Usage: spz launch [OPTIONS]" in launch


def _tiny_app(extra_flag: bool) -> typer.Typer:
    app = typer.Typer(name="tiny", rich_markup_mode="rich")
    sub = typer.Typer(help="Things.")
    app.add_typer(sub, name="things")

    if extra_flag:
        @sub.command("make")
        def make(alpha: int = typer.Option(1, help="How many."),
                 beta: bool = typer.Option(False, "--beta", help="The new flag.")) -> None:
            """Make things."""
    else:
        @sub.command("make")
        def make(alpha: int = typer.Option(1, help="How many.")) -> None:  # type: ignore[misc]
            """Make things."""

    @app.command("secret", hidden=True)
    def secret() -> None:
        """Not listed."""

    return app


def test_a_new_flag_changes_the_reference():
    before = docgen.render_app(typer.main.get_command(_tiny_app(extra_flag=False)), prog="tiny")
    after = docgen.render_app(typer.main.get_command(_tiny_app(extra_flag=True)), prog="tiny")
    assert "## `tiny things make`" in before and "--alpha" in before
    assert "--beta" not in before and "--beta" in after and "The new flag." in after
    assert "## `tiny secret` *(hidden)*" in before
    # The same app renders the same text twice (no terminal or time in it).
    assert before == docgen.render_app(typer.main.get_command(_tiny_app(extra_flag=False)), prog="tiny")
