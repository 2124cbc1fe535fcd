"""The path check of tools/doctest_blocks.py (check_paths, part of the
doc_blocks ctest): every path of the tree that README.md and docs/*.md write
in a code span exists, and every test file they name alone is one of the
tree's. The oracle is the file system: the docs as they are pass, and a
page planted in a scratch tree fails on exactly the paths that tree lacks."""
import glob
import os

from molgen_bin import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def doctest_blocks():
    return load_file("doctest_blocks", os.path.join(REPO, "tools", "doctest_blocks.py"))


def test_docs_name_only_existing_paths():
    d = doctest_blocks()
    pages = [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    assert len(pages) > 5
    bad = [msg for page in pages for msg in d.check_paths(page)]
    assert not bad, "\n".join(bad)


def test_planted_page_fails_on_missing_paths_only(tmp_path):
    d = doctest_blocks()
    for f in ("molgen/tests/gen/test_score.py", "molgen/train/train.c", "tools/x.py",
              "docs/y.md"):
        os.makedirs(os.path.dirname(str(tmp_path / f)), exist_ok=True)
        (tmp_path / f).write_text("")
    page = tmp_path / "docs" / "page.md"
    page.write_text("\n".join([
        "Present: `molgen/tests/gen/test_score.py`, `tools/x.py --flag`, `docs/y.md#part`,",
        "`molgen/train/train.c:12`, the stem `molgen/train/train`, `./tools/x.py`,",
        "globs `molgen/tests/<subject>/test_*.c` and `molgen/tests/*/test_*.py`, `test_score.py`,",
        "outputs `build/molgen/molgen`, `out/run/scored.csv`; words like `bench` or `src` alone.",
        "Missing: `molgen/tests/test_score.py` and `bench/gone.py`,",
        "`python3 tools/absent.py --x`, `molgen/nothing/test_*.c`, and `test_gone.py`.",
        "```sh",
        "`tools/in_a_fence.py` is code, not a path named in the text",
        "```",
    ]) + "\n")
    got = d.check_paths(str(page), repo=str(tmp_path))
    p = str(page)
    assert got == [
        p + ":5: names a path that does not exist: molgen/tests/test_score.py",
        p + ":5: names a path that does not exist: bench/gone.py",
        p + ":6: names a path that does not exist: tools/absent.py",
        p + ":6: names a path that does not exist: molgen/nothing/",
        p + ":6: names a test file that does not exist: test_gone.py",
    ], "\n".join(got)
