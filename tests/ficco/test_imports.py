"""Which folder may import which (:data:`ALLOWED`, the README's architecture table), and no import circle:
neither between ficco's packages nor between the modules of one package.

Every ``import`` in the source counts, those inside functions too, except the ones under
``if TYPE_CHECKING:`` (annotations only, never run)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("features", "executor", "harness", "training", "service", "runtime", "ficco", "benchmarks")
PRODUCT = ("features", "executor", "harness", "training", "service", "runtime", "ficco", "ficco.cli")
ALLOWED: dict[str, set[str]] = {
    "ficco": set(),  # the helpers every package shares (files, tables, rounds, errors, extras)
    "features": {"ficco"},
    "executor": {"features", "ficco"},
    "harness": {"executor", "features", "ficco"},
    "training": {"harness", "features", "ficco"},  # `ficco retrain` runs a harness sweep
    "service": {"training", "features", "ficco"},  # never torch: no executor, no harness
    "runtime": {"executor", "training", "features", "ficco"},
    "ficco.cli": {"harness", "training", "service", "features", "ficco"},
    "benchmarks": set(PRODUCT),
}
"""Layer -> the layers it may import: data flows scenario -> executor timings (harness) -> dataset -> model
(training) -> recommendation (service, runtime) -> executor, and each layer imports only what lies below it.
Nothing in the product imports ``benchmarks`` or the tests' support modules."""


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _runtime_nodes(tree: ast.AST):
    """Every node but what lies under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The repository modules ``name`` imports (``ficco.<package>`` read as ``<package>``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for target in targets:
            head, _, rest = target.strip(".").partition(".")
            if head == "ficco" and rest.split(".")[0] in PACKAGES:
                target = rest
            if target in modules and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                out.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_no_module_imports_itself_round_a_circle():
    assert _cycles(_graph()) == []


def _package(module: str) -> str:
    """The layer a module belongs to: its package, but ``ficco.cli`` (the command line, on top of every
    package) apart from ``ficco``'s helpers (files, tables, rounds, errors: below every package)."""
    return module if module == "ficco.cli" else module.split(".")[0]


def _layer_imports() -> dict[str, dict[str, list[str]]]:
    """Layer -> each other layer it imports -> the ``module -> module`` imports that do."""
    found: dict[str, dict[str, list[str]]] = {}
    for name, targets in _graph().items():
        for target in targets:
            if _package(target) != _package(name):
                found.setdefault(_package(name), {}).setdefault(_package(target), []).append(
                    f"{name} -> {target}"
                )
    return found


def test_every_layer_imports_only_what_the_table_allows():
    wrong = {
        f"{layer} -> {other}": arrows
        for layer, imported in _layer_imports().items()
        for other, arrows in imported.items()
        if other not in ALLOWED[layer]
    }
    assert wrong == {}


def test_no_product_module_imports_test_support():
    support = {p.stem for p in (REPO / "tests").rglob("*.py")} | {"tests", "conftest"}
    found = []
    for name, path in _modules().items():
        if _package(name) not in PRODUCT:
            continue
        for node in _runtime_nodes(ast.parse(path.read_text())):
            heads = []
            if isinstance(node, ast.Import):
                heads = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                heads = [node.module.split(".")[0]]
            found += [f"{name} imports {head}" for head in heads if head in support]
    assert found == []


def test_only_the_studies_own_tests_import_the_studies():
    """Tests of the product import no finished study (what they share with one: ``benchmarks.support``)."""
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.parent.name == "benchmarks":
            continue
        for node in _runtime_nodes(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            if any(n == "benchmarks.studies" or n.startswith("benchmarks.studies.") for n in names):
                found.append(str(path.relative_to(REPO)))
    assert found == []


def _readme_imports() -> dict[str, set[str]]:
    """The README architecture table's ``imports`` column: folder -> the folders it names (``ficco/``'s cell
    names the helpers' imports, then after ``;`` the CLI's)."""
    section = (REPO / "README.md").read_text().split("## Architecture", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        folder = re.fullmatch(r"`(\w+)/`", cells[0])
        if len(cells) != 3 or folder is None:
            continue
        mine, _, cli = cells[2].partition(";")
        out[folder.group(1)] = set(re.findall(r"`(\w+)/`", mine))
        if folder.group(1) == "ficco":
            out["ficco.cli"] = set(re.findall(r"`(\w+)/`", cli))
    return out


def test_the_readme_states_the_allowed_imports():
    stated = {layer: named for layer, named in _readme_imports().items() if layer != "benchmarks"}
    assert stated == {layer: allowed for layer, allowed in ALLOWED.items() if layer != "benchmarks"}


def test_no_package_imports_itself_round_a_circle():
    packages: dict[str, set[str]] = {}
    for name, targets in _graph().items():
        mine = _package(name)
        packages.setdefault(mine, set()).update(_package(t) for t in targets if _package(t) != mine)
    assert _cycles(packages) == []
