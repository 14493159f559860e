"""Tools for a developer's machine and the test suite, never shipped in the app: a private
Redis server when none answers (devredis) and process-group helpers (processes). Used by
scripts/demo.py, tests/, bench/ and faults/; ratejobs/ never imports them."""
