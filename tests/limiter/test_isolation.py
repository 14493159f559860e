"""The limiter package stays free of Django and Celery, and its Lua files document themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ratejobs.limiter

LUA_DIR = Path(ratejobs.limiter.__file__).parent / "lua"


def test_limiter_imports_neither_django_nor_celery():
    code = (
        "import sys, ratejobs.limiter, ratejobs.limiter.aio; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'celery')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_script_documents_keys_argv_and_return():
    for path in LUA_DIR.glob("*.lua"):
        if path.name == "prelude.lua":
            continue
        header = path.read_text().split("]]", 1)[0]
        assert re.search(r"KEYS\[1\]", header), path.name
        assert "Returns" in header, path.name


def test_all_keys_of_a_limiter_share_one_hash_tag(redis_client):
    limiter = ratejobs.limiter.Limiter(redis_client, "cluster-check")
    tags = {re.search(r"\{([^}]*)\}", key).group(1) for key in limiter.keys}
    assert tags == {"cluster-check"}
