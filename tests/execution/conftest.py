"""The execution tests' fixtures: the real HTTP server lives with the other real parts
(tests/realhttp.py); http_server and marker come from tests/conftest.py."""

from tests.realhttp import second_server, session  # noqa: F401 (fixtures)
