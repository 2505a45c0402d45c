"""The package's layers: imports run one way, so each part reads with only what lies below it.

Each subpackage (``trainer.night``, ``trainer.learn``, ``trainer.sim``, ``trainer.site``...) and each top-level module
is one node; every import between them counts, at the top of a module, inside a function or under
``if TYPE_CHECKING:`` (an annotation that names a type from above is an arrow up all the same). Inside a package,
its modules import one another one way too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trainer"
# What every other part may import and which imports none of them.
BASE = {"trainer.base", "trainer.config"}
# The packages from the ground up: each imports only packages before it (docs/architecture.md).
LAYERS = ("trainer.base", "trainer.shipped", "trainer.config", "trainer.site", "trainer.run", "trainer.env",
          "trainer.references", "trainer.sim", "trainer.judge", "trainer.learn", "trainer.export", "trainer.night",
          "trainer.tune", "trainer.benchmark", "trainer.cli", "trainer.__main__")


def _node(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _module_imports() -> dict[str, set[str]]:
    """Each module's imports of the package's other modules (a package's ``__init__`` is the package)."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
               for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainer"):
                # ``from trainer.learn import warm_start`` imports the module warm_start, not the package
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target in modules and target != name and target != "trainer":
                    graph.setdefault(name, set()).add(target)
    return graph


def _imports() -> dict[str, set[str]]:
    """Each node's imports of other nodes."""
    graph: dict[str, set[str]] = {}
    for module, targets in _module_imports().items():
        for target in targets:
            if _node(target) != _node(module):
                graph.setdefault(_node(module), set()).add(_node(target))
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            found = visit(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found:
            return found
    return None


def test_no_import_runs_up_the_layers():
    graph = _imports()
    assert {"trainer.night", "trainer.learn", "trainer.run"} <= set(graph)  # the walk sees the package
    assert _cycle(graph) is None, " → ".join(_cycle(graph) or [])


def test_every_package_imports_only_those_below_it():
    graph = _imports()
    assert set(graph) | {t for targets in graph.values() for t in targets} == set(LAYERS)  # every package has its floor
    up = sorted(f"{node} → {target}" for node, targets in graph.items() for target in targets
                if LAYERS.index(target) >= LAYERS.index(node))
    assert up == []


def test_only_the_entry_points_lie_directly_under_trainer():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_no_module_imports_another_that_imports_it_back():
    """A circle inside a package (two modules importing each other, lazily or for annotations) is one too."""
    cycle = _cycle(_module_imports())
    assert cycle is None, " → ".join(cycle or [])


def test_the_base_imports_nothing_above_it():
    above = {base: sorted(target for target in _imports().get(base, ()) if target not in BASE) for base in BASE}
    assert {base: targets for base, targets in above.items() if targets} == {}


def test_a_cycle_is_found_and_named():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _lazy_imports_without_a_reason() -> list[str]:
    """Imports inside functions whose group (consecutive imports) carries no comment saying why they are there."""
    missing = []
    for path in [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "monitor").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        lines, tree = text.splitlines(), ast.parse(text)
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                       and "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for block in (n for n in ast.walk(function) if hasattr(n, "body") and isinstance(n.body, list)):
                group: list[ast.stmt] = []
                for statement in [*block.body, None]:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)) and id(statement) not in typing_only:
                        group.append(statement)
                        continue
                    said = range(group[0].lineno - 2, group[-1].end_lineno) if group else ()  # the line above, its own
                    if group and not any(lines[i].lstrip().startswith("#") or "  #" in lines[i] for i in said):
                        missing.append(f"{path.relative_to(PACKAGE.parent)}:{group[0].lineno}")
                    group = []
    return sorted(set(missing))


def test_every_lazy_import_says_why_it_is_lazy():
    assert _lazy_imports_without_a_reason() == []
