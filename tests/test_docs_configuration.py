"""docs/configuration.md lists exactly the environment variables ratejobs reads: a setting added
without its row, or a row left behind by a setting removed, fails here.

Each table of the page is checked against its own sources, read as text (no import): the
app's settings (ratejobs/conf.py), the settings package (and the Celery app's default settings
module); the tools that start things
(scripts/demo.py, the Makefile's `?=` variables, docker-compose.yml's `${...}`); and the names
ratejobs/ itself reads with `os.environ` (the HTTP client's CA bundle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _string_arg(call: ast.Call) -> str | None:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value
    return None


def _is_env_call(func: ast.expr) -> bool:
    """`env(...)` or `env.<cast>(...)`: django-environ's reader, as the settings name it."""
    if isinstance(func, ast.Name):
        return func.id == "env"
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id == "env"
    )


def _is_os_environ_read(node: ast.AST) -> str | None:
    """The name in `os.environ.get("X")`, `os.environ.setdefault("X", ...)`,
    `os.environ["X"]` or `os.getenv("X")`."""

    def is_os_environ(value: ast.expr) -> bool:
        return (
            isinstance(value, ast.Attribute)
            and value.attr == "environ"
            and isinstance(value.value, ast.Name)
            and value.value.id == "os"
        )

    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        if func.attr in ("get", "setdefault") and is_os_environ(func.value):
            return _string_arg(node)
        if func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os":
            return _string_arg(node)
    if isinstance(node, ast.Subscript) and is_os_environ(node.value):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    return None


def _names_read(path: Path, *, env_calls: bool) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        name = _is_os_environ_read(node)
        if name is None and env_calls and isinstance(node, ast.Call) and _is_env_call(node.func):
            name = _string_arg(node)
        if name is not None and ENV_NAME.match(name):
            names.add(name)
    return names


def app_settings() -> set[str]:
    """The names of ratejobs' own settings, `Setting("NAME", ...)` in ratejobs/conf.py: the
    project reads each from the variable of the same name (conf.from_environment)."""
    tree = ast.parse((ROOT / "ratejobs" / "conf.py").read_text())
    return {
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "Setting"
        and (name := _string_arg(node)) is not None
    }


def settings_variables() -> set[str]:
    names = app_settings()
    for path in sorted((ROOT / "project" / "settings").glob("*.py")):
        names |= _names_read(path, env_calls=True)
    return names | _names_read(ROOT / "project" / "celery.py", env_calls=False)


def tool_variables() -> set[str]:
    names = _names_read(ROOT / "scripts" / "demo.py", env_calls=False)
    makefile = (ROOT / "Makefile").read_text()
    names |= set(re.findall(r"^([A-Z][A-Z0-9_]*) \?=", makefile, re.MULTILINE))
    compose = (ROOT / "docker-compose.yml").read_text()
    names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", compose))
    return names


def library_variables() -> set[str]:
    """What ratejobs/ reads from os.environ by a fixed name, but for names the tables above
    have (devredis' default for REDIS_URL) and the sandbox's own child processes."""
    names = set()
    for path in sorted((ROOT / "ratejobs").rglob("*.py")):
        names |= _names_read(path, env_calls=False)
    return names


def documented_tables() -> dict[str, set[str]]:
    """Every backquoted UPPER_CASE name in the first column of each table, by the `##` heading
    the table is under."""
    tables: dict[str, set[str]] = {}
    heading = ""
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
        elif line.startswith("| ") and not set(line) <= set("|-: "):
            first_cell = line.split("|")[1]
            names = {n for n in re.findall(r"`([^`]+)`", first_cell) if ENV_NAME.match(n)}
            tables.setdefault(heading, set()).update(names)
    return tables


def test_every_setting_read_from_the_environment_is_documented_and_nothing_else():
    documented = documented_tables()["Settings"]
    read = settings_variables()
    assert read - documented == set(), "read by project/settings but not in the Settings table"
    assert documented - read == set(), "in the Settings table but read by no settings module"


def test_every_variable_of_the_demo_make_and_compose_is_documented():
    documented = documented_tables()["make, the demo and compose"]
    read = tool_variables() - settings_variables()
    assert read - documented == set(), "read by the demo, the Makefile or compose, not documented"
    assert documented - read == set(), "documented for the tools, but none of them reads it"


def test_every_variable_the_workers_read_by_name_is_documented():
    documented = documented_tables()["Read by the workers' HTTP client"]
    read = library_variables() - settings_variables() - tool_variables()
    assert read - documented == set(), "read by ratejobs/ from os.environ, not documented"
    assert documented - read == set(), "documented, but ratejobs/ does not read it by that name"


def test_the_extraction_finds_what_it_should():
    # guards the test itself: a parser that found nothing would make the checks above vacuous
    assert {"DATABASE_URL", "RATEJOBS_MAX_WORKER_WAIT", "DJANGO_HTTPS"} <= settings_variables()
    assert {"REDIS_URL", "RATEJOBS_TRUSTED_PROXY_COUNT"} <= app_settings()
    assert {"DJANGO_SETTINGS_MODULE"} <= settings_variables()
    assert {"DEMO_CALLS", "TEST_MARK", "WORKER_CONCURRENCY"} <= tool_variables()
