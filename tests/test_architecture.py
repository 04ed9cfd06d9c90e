"""The layering, checked on the source: every module of the package is parsed with `ast` (none
is imported) and its imports are read — at the top, inside functions and under TYPE_CHECKING
alike, since imports inside functions are how cycles hide.

- a service never imports another service; `events/` imports no service and no CLI;
- a service imports no CLI, except a platform package's CLI plugin (the modules that the
  `skypurza.cli_plugins` entry points of pyproject.toml name: CLI code living with its package);
- open code never imports platform code (PLATFORM_PACKAGES; docs/DESIGN.md, *Open and platform*),
  nor names a platform module in a string (an `importlib` path: platform services and commands
  join through entry points, `skypurza.services` and `skypurza.cli_plugins`);
- no import cycles among the package's modules.

tests/ and bench/ are not the package and may import anything.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "skypurza"
TOPS = ("events", "services", "cli")

# The platform side of the plan: services sold on top of the open broker (accounting today:
# usage, billing, showback, settlement, export; dispatch, observability and the console will
# join). Everything else in the package is the open broker (the status projections included:
# services/status/). Open code reaches the platform only over the bus (events/ledger_queries.py)
# and through entry points (cli/plugins.py: CLI plugins, and services for `spz api serve`).
PLATFORM_PACKAGES = ("skypurza.services.ledger", "skypurza.services.observability", "skypurza.services.dispatch")
PLUGIN_GROUP = "skypurza.cli_plugins"
SERVICES_GROUP = "skypurza.services"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the package module imported (the most specific one that exists)
    line: int

    def where(self, modules: dict[str, Path], root: Path) -> str:
        return f"{modules[self.source].relative_to(root)}:{self.line}: {self.source} -> {self.target}"


# ---------------------------------------------------------------- reading the source


def package_modules(root: Path, tops: tuple[str, ...] = TOPS, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for the package rooted at `root` (the repository root is the package)."""
    modules = {package: root / "__init__.py"}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        # `from pkg import name`: a submodule when pkg.name is one, else a name of pkg itself
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
    found = []
    for name in names:
        while name and name not in modules and "." in name:
            name = name.rpartition(".")[0]
        if name in modules:
            found.append(name)
    return found


def imports(modules: dict[str, Path]) -> list[Import]:
    """Every import of a package module by a package module, wherever it is written."""
    out = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out += [Import(module, t, node.lineno) for t in _targets(module, path, node, modules) if t != module]
    return sorted(set(out), key=lambda e: (e.source, e.line, e.target))


def plugin_modules(pyproject: Path, group: str = PLUGIN_GROUP) -> dict[str, str]:
    """Entry-point name -> 'module:callable', for the CLI plugins (or services) pyproject.toml declares."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return dict(project.get("entry-points", {}).get(group, {}))


# ---------------------------------------------------------------- the rules (pure)


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _service_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "services" else None


def layering_violations(edges: list[Import], plugins: Collection[str] = ()) -> list[Import]:
    bad = []
    for e in edges:
        src, dst = _service_of(e.source), _service_of(e.target)
        if src and dst and src != dst:
            bad.append(e)  # a service imports another service
        elif _under(e.source, f"{PACKAGE}.events") and (dst or _under(e.target, f"{PACKAGE}.cli")):
            bad.append(e)  # events/ imports a service or the CLI
        elif src and _under(e.target, f"{PACKAGE}.cli") and e.source not in plugins:
            bad.append(e)  # a service imports the CLI (only a CLI plugin module may)
    return bad


def platform_violations(edges: list[Import], platform: tuple[str, ...] = PLATFORM_PACKAGES) -> list[Import]:
    def is_platform(m: str) -> bool:
        return any(_under(m, p) for p in platform)

    return [e for e in edges if is_platform(e.target) and not is_platform(e.source)]


def platform_names(modules: dict[str, Path], platform: tuple[str, ...] = PLATFORM_PACKAGES) -> list[str]:
    """Where an open module names a platform module in a string literal ("file:line: text")."""
    def is_platform(m: str) -> bool:
        return any(_under(m, p) for p in platform)

    found = []
    for module, path in modules.items():
        if is_platform(module):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and any(
                    p in node.value for p in platform):
                found.append(f"{path.name}:{node.lineno}: {node.value[:80]!r}")
    return found


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# ---------------------------------------------------------------- the package as it is

MODULES = package_modules(ROOT)
EDGES = imports(MODULES)
PLUGINS = plugin_modules(ROOT / "pyproject.toml")


def _report(bad: list[Import]) -> list[str]:
    return [e.where(MODULES, ROOT) for e in bad]


def test_the_scan_sees_the_package():
    """The checks below mean something only if the scan finds imports: a few that must be there
    (a top-level one, a relative one, one inside a function)."""
    pairs = {(e.source, e.target) for e in EDGES}
    assert ("skypurza.cli.main", "skypurza.cli.lazyapp") in pairs
    assert ("skypurza.events.envelope", "skypurza.events.registry") in pairs
    assert ("skypurza.services.ledger.cli", "skypurza.services.ledger.billing") in pairs  # inside a function
    assert len(MODULES) > 100 and len(EDGES) > 300


def test_services_never_import_each_other_and_events_imports_no_service_or_cli():
    plugins = {value.partition(":")[0] for value in PLUGINS.values()}
    assert _report(layering_violations(EDGES, plugins)) == []


def test_open_code_never_imports_platform_code():
    assert _report(platform_violations(EDGES)) == []


def test_open_code_names_no_platform_module_in_a_string():
    """An import by string (`importlib.import_module("skypurza.services.ledger...")`) is an
    import the scan above cannot see: open code names no platform module at all."""
    assert platform_names(MODULES) == []


def test_platform_services_join_through_entry_points():
    """`spz api serve` finds the ledger through the `skypurza.services` group, and its open list
    names only open services."""
    from skypurza.cli import serve

    services = plugin_modules(ROOT / "pyproject.toml", SERVICES_GROUP)
    assert services == {"ledger": "skypurza.services.ledger.service:LedgerService",
                        "dispatch": "skypurza.services.dispatch.service:DispatchService",
                        "observability": "skypurza.services.observability.service:ObservabilityService",
                        "gpuhealth": "skypurza.services.observability.gpuhealth.service:GpuHealthService",
                        "alerts": "skypurza.services.observability.alerts.service:AlertsService"}
    for name, value in services.items():
        module, _, cls = value.partition(":")
        assert any(_under(module, p) for p in PLATFORM_PACKAGES), f"{name}: {module} is not platform code"
        assert cls in {n.name for n in ast.parse(MODULES[module].read_text()).body if isinstance(n, ast.ClassDef)}
    assert "status" in serve.OPEN_SERVICES
    assert not [v for v in serve.OPEN_SERVICES.values() if any(_under(v.partition(":")[0], p) for p in PLATFORM_PACKAGES)]


def test_no_import_cycles():
    """A cycle is reported with every import between its modules, each where it is written."""
    found = cycles(EDGES)
    assert [_report([e for e in EDGES if e.source in c and e.target in c]) for c in found] == []


def test_cli_plugins_are_platform_packages_with_a_register_function():
    """Each declared plugin lives in a platform package and defines the callable it names."""
    assert PLUGINS, f"pyproject.toml declares the {PLUGIN_GROUP} entry points"
    for name, value in PLUGINS.items():
        module, _, func = value.partition(":")
        assert any(_under(module, p) for p in PLATFORM_PACKAGES), f"{name}: {module} is not platform code"
        assert module in MODULES, f"{name}: no module {module}"
        tree = ast.parse(MODULES[module].read_text())
        assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, f"{name}: no {func}() in {module}"


# ---------------------------------------------------------------- the checker catches what it must


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    (root / "__init__.py").write_text("")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(text)
    return package_modules(root)


def test_the_checker_finds_planted_violations(tmp_path):
    modules = _tree(tmp_path, {
        "events/a.py": "def f():\n    from . import b\n",                       # a cycle, half in a function
        "events/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\n",
        "events/c.py": "from skypurza.services.optimizer import decide\n",      # events -> a service
        "services/optimizer/decide.py": "from ..provisioner import plan\n",     # service -> service
        "services/provisioner/plan.py": "import skypurza.services.ledger.billing as bl\n",  # open -> platform
        "services/ledger/billing.py": "from skypurza.cli import context\n",    # service -> CLI
        "services/ledger/cli.py": "from skypurza.cli import context\nfrom . import billing\n",  # a plugin: fine
        "cli/context.py": "",
        "cli/serve.py": 'SERVICES = {"ledger": "skypurza.services.ledger.service:LedgerService"}\n',  # by string
    })
    edges = imports(modules)
    assert cycles(edges) == [["skypurza.events.a", "skypurza.events.b"]]
    assert {(e.source, e.target) for e in layering_violations(edges, {"skypurza.services.ledger.cli"})} == {
        ("skypurza.events.c", "skypurza.services.optimizer.decide"),
        ("skypurza.services.optimizer.decide", "skypurza.services.provisioner.plan"),
        ("skypurza.services.provisioner.plan", "skypurza.services.ledger.billing"),
        ("skypurza.services.ledger.billing", "skypurza.cli.context"),
    }
    assert [(e.source, e.target, e.line) for e in platform_violations(edges)] == [
        ("skypurza.services.provisioner.plan", "skypurza.services.ledger.billing", 1)]
    # An import statement is the scan's (above); a string naming a platform module is this one's.
    assert platform_names(modules) == ["serve.py:1: 'skypurza.services.ledger.service:LedgerService'"]
