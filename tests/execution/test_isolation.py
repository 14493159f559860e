"""The execution package stays free of Django and Celery, like the limiter."""

from __future__ import annotations

import subprocess
import sys


def test_execution_imports_neither_django_nor_celery():
    code = (
        "import sys, ratejobs.execution; "
        "import ratejobs.execution.attempt, ratejobs.execution.http, "
        "ratejobs.execution.connections, ratejobs.execution.errors, ratejobs.execution.watchdog; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
