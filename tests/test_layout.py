"""The package layout is the architecture: the import graph of hispec/, ui/ and app.py, read from
the source (every import, those inside functions too), keeps the rules that docs/DESIGN.md states."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "model", "training", "evaluation", "serving", "cli")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or the module an imported name lives in), dotted
    names: tuple[str, ...]  # names taken with `from target import ...`
    line: int
    typing_only: bool  # under `if TYPE_CHECKING:`


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    files = [*ROOT.glob("hispec/**/*.py"), *ROOT.glob("ui/**/*.py"), ROOT / "app.py"]
    return {module_name(p): p for p in files}


def _typing_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports(modules: dict[str, Path]) -> list[Import]:
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing = _typing_lines(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append(Import(name, alias.name, (), node.lineno, node.lineno in typing))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                names = tuple(a.name for a in node.names)
                # `from pkg import module` imports a module, not a name
                for n in names:
                    target = f"{base}.{n}" if f"{base}.{n}" in modules else base
                    found.append(Import(name, target, (n,) if target == base else (), node.lineno,
                                        node.lineno in typing))
    return found


def _internal(target: str, modules: dict[str, Path]) -> str | None:
    while target:
        if target in modules:
            return target
        target = target.rpartition(".")[0]
    return None


@pytest.fixture(scope="module")
def graph():
    modules = sources()
    return modules, imports(modules)


def test_the_packages_exist(graph):
    modules, _ = graph
    for package in PACKAGES:
        assert f"hispec.{package}" in modules, package
    flat = sorted(m for m, p in modules.items() if m.count(".") == 1 and m.startswith("hispec.")
                  and p.name != "__init__.py")
    # only the shared basics and the entry point stay at the top
    assert flat == ["hispec.__main__", "hispec.errors", "hispec.paths", "hispec.text"], flat


def test_no_import_cycles(graph):
    modules, found = graph
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        target = _internal(imp.target, modules)
        if target and target != imp.source and not imp.typing_only:
            edges[imp.source].add(target)
    # Tarjan's strongly connected components: any component with two modules is a cycle
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert cycles == [], cycles


def test_the_engine_imports_no_ui_serving_cli_or_transformers(graph):
    modules, found = graph
    banned = ("ui", "app", "hispec.serving", "hispec.cli", "hispec.evaluation", "hispec.training", "transformers",
              "gradio", "plotly")
    bad = [imp for imp in found if imp.source.startswith("hispec.engine") and not imp.typing_only
           and any(imp.target == b or imp.target.startswith(b + ".") for b in banned)]
    assert bad == [], bad


def test_the_package_imports_nothing_from_the_ui(graph):
    _, found = graph
    bad = [imp for imp in found if imp.source.startswith("hispec")
           and (imp.target in ("app", "ui") or imp.target.startswith("ui."))]
    assert bad == [], bad


def test_no_private_names_cross_modules(graph):
    """`from x import _name` and `module._name` between HiSpec's own modules (tests may)."""
    modules, found = graph
    bad = [imp for imp in found if _internal(imp.target, modules) and imp.target != imp.source
           and any(n.startswith("_") and not n.startswith("__") for n in imp.names)]
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        aliases = {}
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")
                    up = up[: len(up) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                bad.append(f"{name}:{node.lineno} {node.value.id}.{node.attr}")
    assert bad == [], bad


def test_tests_are_grouped_like_the_packages():
    tests = ROOT / "tests"
    groups = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert set(PACKAGES) - {"cli"} <= groups and {"ui", "cli"} <= groups, groups
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert loose == ["test_layout.py"], loose  # the layout's own check stays at the top


def test_the_ui_holds_gradio_code_only(graph):
    """ui/ and app.py never build a Decoder or run the engine loop themselves: serving does."""
    _, found = graph
    bad = [imp for imp in found if (imp.source == "app" or imp.source.startswith("ui"))
           and imp.target.startswith("hispec.engine") and set(imp.names) & {"Decoder", "decode"}]
    assert bad == [], bad
