"""The code's layout, read from its imports (every import, at module level or inside a function):
the limiter, the HTTP execution and the worker's pool of threads know nothing of Django or
Celery, the way from an upload to a recorded result reads top to bottom with no import cycle,
and each package is one idea: the worker's machinery (ratejobs.worker) is run by the tasks, not
by the services it drives, and the development tools (sandbox, devtools, faults, bench) stay out
of the app."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ratejobs"


def imports_of_every_module(*, everything: bool = False) -> dict[str, set[str]]:
    """What each module of ratejobs imports of ratejobs, Django and Celery (or, `everything`,
    of any package)."""
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
    if everything:
        return graph
    return {name: {i for i in found if i in graph or i.split(".")[0] in ("django", "celery")}
            for name, found in graph.items()}  # fmt: skip


def test_the_limiter_and_the_execution_import_neither_django_nor_celery():
    graph = imports_of_every_module()
    framework = {
        name: sorted(i for i in found if i.split(".")[0] in ("django", "celery"))
        for name, found in graph.items()
        if name.startswith(("ratejobs.limiter", "ratejobs.execution", "ratejobs.worker.pool"))
    }
    assert {name: found for name, found in framework.items() if found} == {}


LAYERS = ("ratejobs.services", "ratejobs.tasks", "ratejobs.worker")


def test_no_import_cycle_between_worker_services_and_tasks():
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


def test_only_the_tasks_start_the_worker_engine():
    """The engine (a process's heartbeats, sweeps and pool of threads) and its pool belong to a
    worker process: the tasks start it (and project/celery.py, outside the package); services,
    selectors and pages never do."""
    graph = imports_of_every_module()
    machinery = ("ratejobs.worker.engine", "ratejobs.worker.pool")
    users = {
        name
        for name, found in graph.items()
        if any(i.startswith(machinery) for i in found) and not name.startswith("ratejobs.worker")
    }
    assert users == {"ratejobs.tasks"}


def test_the_worker_drives_the_services_and_nothing_below_imports_it():
    """The worker's machinery calls the services; the services, selectors and infrastructure
    never call back into it. What they need of the fleet (a dispatch run asked for, a worker's
    heartbeat read) lives in ratejobs.infra."""
    graph = imports_of_every_module()
    below = ("ratejobs.services", "ratejobs.selectors", "ratejobs.infra")
    upward = {
        name: sorted(i for i in found if i.startswith("ratejobs.worker"))
        for name, found in graph.items()
        if name.startswith(below)
    }
    assert {name: found for name, found in upward.items() if found} == {}


def test_selectors_never_import_services():
    """Selectors read; services write. What both stand on (the Redis client, each API's limiter
    object, the database's clock) lives in ratejobs.infra, which knows neither."""
    graph = imports_of_every_module()
    reads_writes = {
        name: sorted(i for i in found if i.startswith("ratejobs.services"))
        for name, found in graph.items()
        if name.startswith("ratejobs.selectors")
    }
    assert {name: found for name, found in reads_writes.items() if found} == {}
    above = ("ratejobs.services", "ratejobs.selectors", "ratejobs.worker", "ratejobs.tasks")
    infra = {
        name: sorted(i for i in found if i.startswith(above))
        for name, found in graph.items()
        if name.startswith("ratejobs.infra")
    }
    assert {name: found for name, found in infra.items() if found} == {}


DEVELOPMENT_TOOLS = ("sandbox", "devtools", "faults", "bench", "scripts", "tests")


def test_text_formats_values_and_reads_nothing():
    """ratejobs.text turns values into the words the admin, the command line and the REST API
    show; it reads nothing itself, so every page formats a figure the same way."""
    graph = imports_of_every_module()
    layers = ("ratejobs.services", "ratejobs.selectors", "ratejobs.worker", "ratejobs.infra")
    assert sorted(i for i in graph["ratejobs.text"] if i.startswith(layers)) == []
    formatters = [name for name, found in graph.items() if "ratejobs.text" in found]
    assert any(n.startswith("ratejobs.admin") for n in formatters)
    assert any(n.startswith("ratejobs.management") for n in formatters)


def test_the_app_never_imports_the_development_tools():
    """The sandbox API, the private Redis, the process helpers, the fault suite and the
    benchmarks are for a developer's machine, the tests and CI; the app (ratejobs/, what the
    image ships) works without them."""
    graph = imports_of_every_module(everything=True)
    tools = {
        name: sorted(i for i in found if i.split(".")[0] in DEVELOPMENT_TOOLS)
        for name, found in graph.items()
    }
    assert {name: found for name, found in tools.items() if found} == {}
