"""The limiter package stays free of Django and Celery, and its Lua files document themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import ratejobs.limiter
from ratejobs.limiter.scripts import LIBRARY, PRELUDE

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
        header = path.read_text().split("]]", 1)[0]
        assert re.search(r"KEYS\[1\]", header), path.name
        assert "Returns" in header, path.name


def test_every_library_file_is_joined_once_and_says_what_it_holds():
    files = sorted(path.stem for path in (LUA_DIR / "lib").glob("*.lua"))
    assert sorted(LIBRARY) == files and len(set(LIBRARY)) == len(LIBRARY)
    for name in LIBRARY:
        assert (LUA_DIR / "lib" / f"{name}.lua").read_text().startswith(f"--[[\nlib/{name}.lua: ")


def test_the_library_uses_each_of_its_names_only_after_defining_it():
    # given the joined library without its comments: Lua resolves a name defined later as a
    # global, nil at run time, so a file joined too early fails only on the path that uses it
    code = re.sub(r"--\[\[.*?\]\]", "", PRELUDE, flags=re.S)
    code = re.sub(r"--[^\n]*", "", code)
    defined = re.finditer(r"^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)", code, flags=re.M)
    for match in defined:
        first = re.search(rf"\b{match.group(1)}\b", code)
        assert first.start() >= match.start(), match.group(1)


def test_all_keys_of_a_limiter_share_one_hash_tag(redis_client):
    limiter = ratejobs.limiter.Limiter(redis_client, "cluster-check")
    tags = {re.search(r"\{([^}]*)\}", key).group(1) for key in limiter.keys}
    assert tags == {"cluster-check"}


def test_each_script_carries_the_library_it_uses_and_no_more():
    # given the library's names: a script's text is run whole at every call, so it carries the
    # definitions its body uses (and what they use) and leaves the rest out
    from ratejobs.limiter.scripts import SOURCES

    defined = set(re.findall(r"^local function (\w+)", PRELUDE, flags=re.M))
    carried = {
        name: set(re.findall(r"^local function (\w+)", source, flags=re.M)) & defined
        for name, source in SOURCES.items()
    }
    assert "after_throttle" in carried["feedback"] and "after_throttle" not in carried["release"]
    assert "grant_slot" in carried["acquire"] and "grant_slot" not in carried["state"]
    assert carried["clock"] == {"now_us"}
    # every definition is carried by some script (the library has no dead code)
    assert set().union(*carried.values()) == defined


def test_scripts_write_numbers_into_arguments_exactly():
    # `..` formats a Lua number with 14 significant digits: a µs time (16) loses its last two,
    # so a score bound made with it must go through as_string
    for path in [*LUA_DIR.glob("*.lua"), *(LUA_DIR / "lib").glob("*.lua")]:
        for line in path.read_text().splitlines():
            assert not re.search(r"'\(' \.\. (?!as_string\()", line), (path.name, line)
