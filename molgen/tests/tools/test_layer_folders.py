"""molgen's engine folders are layers (tools/check_layers.py, ENGINE_FOLDERS):
the tree as it is passes, and a copy of it with one planted defect fails
with the finding that names it: an include up the folder order, an engine
file outside the folders, a function over the length limit."""
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CHECK = os.path.join(REPO, "tools", "check_layers.py")
sys.path.insert(0, os.path.join(REPO, "tools"))
import check_layers  # noqa: E402


def run_check(root):
    p = subprocess.run([sys.executable, CHECK, "--root", root],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of what check_layers scans (src/, include/, molgen/ without
    its tests), to plant defects in."""
    root = str(tmp_path_factory.mktemp("tree"))
    for top in check_layers.SCAN:
        shutil.copytree(os.path.join(REPO, top), os.path.join(root, top),
                        ignore=shutil.ignore_patterns("tests", "corpus", "__pycache__"))
    return root


@pytest.fixture
def planted(tree, tmp_path):
    """A fresh copy of the tree for one planted defect."""
    root = str(tmp_path / "t")
    shutil.copytree(tree, root)
    return root


def test_tree_passes():
    rc, out = run_check(REPO)
    assert rc == 0, out
    assert "0 failures" in out


def test_engine_folders_bottom_to_top():
    assert check_layers.ENGINE_NAMES == ["base", "chem", "nn", "gen", "train", "rl", "harness"]
    # CMake builds the same folders (and no others) into molgen_core
    with open(os.path.join(REPO, "molgen", "CMakeLists.txt")) as f:
        m = re.search(r"set\(MOLGEN_ENGINE_FOLDERS ([^)]*)\)", f.read())
    assert m and m.group(1).split() == check_layers.ENGINE_NAMES
    # no engine C file lies outside them
    for name in os.listdir(os.path.join(REPO, "molgen")):
        assert not name.endswith((".c", ".h")), name
        path = os.path.join(REPO, "molgen", name)
        if os.path.isdir(path) and any(f.endswith(".c") for f in os.listdir(path)):
            assert name in check_layers.ENGINE_NAMES + ["cli", "fuzz", "tests"], name


def test_upward_include_fails(planted):
    # base (the bottom) including gen (above it)
    path = os.path.join(planted, "molgen", "base", "json.c")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write('#include "gen/sample.h"\n' + text)
    rc, out = run_check(planted)
    assert rc == 1
    assert re.search(r"FAIL arrow up: molgen/base/json \(molgen/base/\) -> "
                     r"molgen/gen/sample \(molgen/gen/\): #include \"gen/sample.h\"", out), out


def test_sideways_and_down_pass(planted):
    # rl using gen (below it) is allowed: nothing is added to the failures
    path = os.path.join(planted, "molgen", "rl", "scorer_process.c")
    with open(path, "a") as f:
        f.write('\n#include "gen/sample.h"\n')
    rc, out = run_check(planted)
    assert rc == 0, out


def test_file_outside_folders_fails(planted):
    with open(os.path.join(planted, "molgen", "stray.c"), "w") as f:
        f.write("int mg_stray(void) { return 1; }\n")
    rc, out = run_check(planted)
    assert rc == 1
    assert "FAIL an engine room outside the layer folders" in out and "molgen/stray" in out, out


def long_function(name, body_lines):
    return "int %s(int x) {\n%s    return x;\n}\n" % (name, "    x += 1;\n" * body_lines)


def test_long_function_fails(planted):
    # 81 lines from the head to the closing brace: 1 + 78 + 1 + 1
    with open(os.path.join(planted, "molgen", "chem", "long_fn.c"), "w") as f:
        f.write(long_function("mg_planted_long", 78))
    rc, out = run_check(planted)
    assert rc == 1
    assert ("FAIL function longer than 80 lines: molgen/chem/long_fn.c: "
            "mg_planted_long (81 lines)") in out, out


def test_function_at_limit_passes(planted):
    with open(os.path.join(planted, "molgen", "chem", "long_fn.c"), "w") as f:
        f.write(long_function("mg_planted_ok", 77))  # 80 lines
    rc, out = run_check(planted)
    assert rc == 0, out


def test_function_lengths_counted_from_head_to_brace():
    text = "/* x */\nstatic int\nf(int a)\n{\n    return a; /* } */\n}\nint g(void) { return 0; }\n"
    assert check_layers.function_lengths(text) == [("f", 4), ("g", 1)]


def test_docs_name_existing_sources():
    """Every C source path under molgen/, src/ or include/ that the README
    and the guides name (e.g. `molgen/nn/model.c`) exists: a file that moves
    takes its mentions along."""
    named = re.compile(r"\b((?:molgen|src|include)/[\w/]+\.[ch])\b")
    docs = [os.path.join(REPO, "README.md")] + [
        os.path.join(REPO, "docs", f) for f in sorted(os.listdir(os.path.join(REPO, "docs")))
        if f.endswith(".md")]
    missing = []
    for path in docs:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for m in named.finditer(line):
                    if not os.path.exists(os.path.join(REPO, m.group(1))):
                        missing.append("%s:%d: %s" % (os.path.relpath(path, REPO), n, m.group(1)))
    assert not missing, "\n".join(missing)
