"""gen/test_score.py is where every test of `molgen score` is found: a test
function anywhere under molgen/tests that runs the score command is in
gen/test_score*.py or named in gen/test_score.py's SCORE_ELSEWHERE, and every
name there is a test that runs it. "Runs it": the function, or a helper of
its file that it calls, holds a list, tuple or call whose literal strings
include "score" and an option ("--model", ...), as every command line of
these tests is written."""
import ast
import glob
import os

from molgen_bin import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


def names_score_command(node):
    for c in ast.walk(node):
        elts = c.elts if isinstance(c, (ast.List, ast.Tuple)) else \
            c.args if isinstance(c, ast.Call) else []
        words = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if "score" in words and any(w.startswith("--") for w in words):
            return True
    return False


def score_tests(path):
    """Test functions of a file that run `molgen score`, directly or through
    the file's own helper functions (followed to any depth)."""
    with open(path) as f:
        fns = [n for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)]
    runners = {n.name for n in fns if names_score_command(n)}
    while True:
        calls = {n.name: {c.func.id for c in ast.walk(n)
                          if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)} for n in fns}
        more = {n.name for n in fns if n.name not in runners and calls[n.name] & runners}
        if not more:
            break
        runners |= more
    return [n.name for n in fns if n.name.startswith("test_") and n.name in runners]


def test_every_score_test_is_in_gen_or_listed():
    mod = load_file("score_tests_index", os.path.join(TESTS, "gen", "test_score.py"))
    found, here = set(), set()
    for path in sorted(glob.glob(os.path.join(TESTS, "**", "test_*.py"), recursive=True)):
        rel = os.path.relpath(path, TESTS)
        for name in score_tests(path):
            (here if rel.startswith("gen/test_score") else found).add(rel + "::" + name)
    assert len(here) >= 5, sorted(here)  # the finder sees gen/test_score*.py's own
    listed = set(mod.SCORE_ELSEWHERE)
    assert len(listed) == len(mod.SCORE_ELSEWHERE), "a test listed twice"
    assert not found - listed, "runs molgen score, not in SCORE_ELSEWHERE: %s" % sorted(found - listed)
    assert not listed - found, "in SCORE_ELSEWHERE, not a test that runs score: %s" % sorted(listed - found)
