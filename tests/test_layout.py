"""The code's layout, read from its imports (every import, at module level or inside a function):
the limiter and the HTTP execution know nothing of Django or Celery, and the way from an
upload to a recorded result reads top to bottom, with no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ratejobs"


def imports_of_every_module() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
        graph[name] = found
    return {name: {i for i in found if i in graph or i.split(".")[0] in ("django", "celery")}
            for name, found in graph.items()}  # fmt: skip


def test_the_limiter_and_the_execution_import_neither_django_nor_celery():
    graph = imports_of_every_module()
    framework = {
        name: sorted(i for i in found if i.split(".")[0] in ("django", "celery"))
        for name, found in graph.items()
        if name.startswith(("ratejobs.limiter", "ratejobs.execution"))
    }
    assert {name: found for name, found in framework.items() if found} == {}


LAYERS = ("ratejobs.services", "ratejobs.tasks", "ratejobs.dispatch")


def test_no_import_cycle_between_dispatch_services_and_tasks():
    graph = imports_of_every_module()
    ours = {
        name: {i for i in found if i in graph and i.startswith(LAYERS)}
        for name, found in graph.items()
        if name.startswith(LAYERS)
    }
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for imported in sorted(ours.get(name, ())):
            if imported in path:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            else:
                visit(imported, [*path, imported])

    for name in sorted(ours):
        visit(name, [name])
    assert cycles == []
    # and nothing below the tasks knows them: messages go out by task name
    assert not [name for name, found in ours.items() if "ratejobs.tasks" in found]
