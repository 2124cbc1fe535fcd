#!/usr/bin/python3
"""Runs the marked console blocks of README.md and docs/*.md and compares
what each command prints with what the block shows.

    /usr/bin/python3 tools/doctest_blocks.py [--build DIR] [--list] [FILE.md ...]

A block is tested when the line right before its opening fence is

    <!-- doctest -->            or, with options,   <!-- doctest numbers timeout=60 -->

Inside the block, a line `$ COMMAND` is a command (a trailing backslash
continues it on the next line; so does a next line starting with `> `, the
shell's second prompt, as inside a quoted string) and the lines up to the next
`$ ` line are its expected output, stdout and stderr together. Matching is
line by line, trailing blanks ignored:
  - a line that is exactly `...` matches any number of lines, none included;
  - `...` inside a line matches any text on that line;
  - option `numbers`: every number in the block's expected output matches
    any number (for timings and rates);
  - option `timeout=N`: seconds per command (default 120).
The exit status is not compared (error examples show their message), but a
command killed by a signal or past its timeout fails. Every relative link
of the files (`[text](file.md#anchor)`) is checked too: the file must exist
and the anchor must be one of its headings (GitHub's anchors). So is every
path of the tree written in a code span (`molgen/tests/gen/test_score.py`,
`tools/x.py`, `docs/y.md`): it must exist (check_paths).

Each block runs in bash in a fresh temporary directory that holds a link to
every top-level entry of the repository and `build` linking to --build
(default build/): so `./build/hello_attn`, `models/...` and `data/...` work
as written and outputs land in the temporary directory. The commands of a
block share that directory (one writes a file, the next reads it). The
environment: DIR and DIR/molgen first on PATH (`molgen` is the build's),
PYTHONPATH=python, ATTN_LIBRARY=DIR/libattn.so, OPENBLAS_CORETYPE=Haswell,
OMP_WAIT_POLICY=PASSIVE.

Only cheap commands are marked (a few seconds each: --help, errors, a few
samples, the examples). Left unmarked on purpose, because they take
minutes or print machine-dependent figures: `make run`, `make test`,
training runs of more than a few seconds, mpirun jobs, `molgen bench`,
attn-bench and `bench/speed_report.py`, metrics over thousands of samples.
Exit status: 0 when every block matches, 1 otherwise."""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = re.compile(r"^<!--\s*doctest\b(.*?)-->\s*$")
NUMBER = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
NUMBER_RE = re.compile(NUMBER)


class Block:
    def __init__(self, path, line, options, body):
        self.path, self.line, self.options, self.body = path, line, options, body


def blocks_of(path):
    """The marked blocks of a markdown file: (options, [(line_no, text)])."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m and i + 1 < len(lines) and lines[i + 1].startswith("```"):
            fence = lines[i + 1][:3]
            body = []
            j = i + 2
            while j < len(lines) and not lines[j].startswith(fence):
                body.append((j + 1, lines[j]))
                j += 1
            if j == len(lines):
                raise SystemExit("%s:%d: doctest block without a closing fence" % (path, i + 2))
            out.append(Block(path, i + 2, m.group(1).split(), body))
            i = j
        elif m:
            raise SystemExit("%s:%d: doctest marker not followed by a fenced block" % (path, i + 1))
        i += 1
    return out


def commands_of(block):
    """[(line_no, command, [expected lines])] of a block."""
    cmds = []
    body = block.body
    k = 0
    while k < len(body):
        no, text = body[k]
        if not text.startswith("$ "):
            if cmds:
                cmds[-1][2].append(text)
                k += 1
                continue
            raise SystemExit("%s:%d: a doctest block starts with a '$ ' command line" % (block.path, no))
        cmd = text[2:]
        while k + 1 < len(body) and (cmd.endswith("\\") or body[k + 1][1].startswith("> ")):
            k += 1
            nxt = body[k][1]
            nxt = nxt[2:] if nxt.startswith("> ") else nxt
            cmd = cmd + "\n" + nxt  # bash itself joins a backslash-newline
        cmds.append((no, cmd, []))
        k += 1
    for c in cmds:
        while c[2] and not c[2][-1].strip():
            c[2].pop()
    return cmds


def line_pattern(expected, numbers):
    """A regex for one expected line: '...' is any text, numbers as asked."""
    parts = expected.rstrip().split("...")
    rx = []
    for p in parts:
        if numbers:
            pieces, last = [], 0
            for m in NUMBER_RE.finditer(p):
                pieces.append(re.escape(p[last:m.start()]))
                pieces.append(NUMBER)
                last = m.end()
            pieces.append(re.escape(p[last:]))
            rx.append("".join(pieces))
        else:
            rx.append(re.escape(p))
    return re.compile(".*".join(rx) + r"\Z")


def matches(expected, actual, numbers):
    """Whether the actual lines match the expected ones ('...' lines span)."""
    pats = [None if e.strip() == "..." else line_pattern(e, numbers) for e in expected]
    act = [a.rstrip() for a in actual]
    memo = {}

    def m(i, j):
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(pats):
            r = j == len(act)
        elif pats[i] is None:
            r = any(m(i + 1, k) for k in range(j, len(act) + 1))
        else:
            r = j < len(act) and pats[i].match(act[j]) is not None and m(i + 1, j + 1)
        memo[key] = r
        return r

    return m(0, 0)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def outside_fences(path):
    """(line number, line) of a markdown file, fenced blocks left out."""
    fence = False
    for no, line in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence:
            yield no, line


def anchors(path):
    seen, out = {}, set()
    for _, line in outside_fences(path):
        m = re.match(r"#+ (.*)", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else "%s-%d" % (a, n))
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)")


def check_links(path):
    """Broken relative links of a markdown file, as messages."""
    bad = []
    for no, line in outside_fences(path):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                bad.append("%s:%d: link to a missing file: %s" % (path, no, target))
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append("%s:%d: link to a missing heading: %s" % (path, no, target))
    return bad


# A repo path in a code span: it starts with one of the tree's top-level
# folders (build/ and out/ are outputs, not the tree's). Globs and
# placeholders (`molgen/tests/<subject>/test_*.c`, `cmd_{a,b}.c`) are checked
# up to the last folder before the first wildcard; `#anchor` and `:line`
# tails are dropped; a C file's stem (`molgen/train/train`, a room of
# check_layers.py) names its .c / .h.
TREE_DIRS = ("bench", "common", "data", "docs", "examples", "include", "models", "molgen",
             "python", "src", "tests", "tools", ".ci")
CODE_SPAN = re.compile(r"`([^`]+)`")
REPO_PATH = re.compile(r"(?<![\w./$-])(?:\./)?((?:%s)/[^\s`'\"(),;]*)"
                       % "|".join(re.escape(d) for d in TREE_DIRS))
WILDCARD = re.compile(r"[*?<>{}\[\]$]|\.\.\.|…")


def named_path(token):
    """The part of a path written in a doc that must exist: anchors, :line and
    trailing punctuation dropped; a glob or placeholder cut back to its folder."""
    token = re.sub(r"(#.*|:\d[\d:-]*)$", "", token).rstrip(".:")
    w = WILDCARD.search(token)
    if w:
        token = token[:token.rfind("/", 0, w.start()) + 1]
    return token


# A test file named alone (`test_score.py`): some test folder holds it.
TEST_NAME = re.compile(r"(?<![\w./-])(test_\w+\.(?:py|c))(?![\w/])")


def test_file_names(repo):
    """Names of the test files of the tree (build folders and .git left out)."""
    names = set()
    for root, dirs, files in os.walk(repo):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build"))]
        names.update(f for f in files if TEST_NAME.fullmatch(f))
    return names


def check_paths(path, repo=REPO):
    """Repo paths and test file names in the code spans of a markdown file
    (outside fenced blocks) that do not exist, as messages."""
    bad, tests = [], None
    for no, line in outside_fences(path):
        for span in CODE_SPAN.findall(line):
            for m in REPO_PATH.finditer(span):
                name = named_path(m.group(1))
                where = os.path.join(repo, name)
                if name and not any(os.path.exists(where + ext) for ext in ("", ".c", ".h")):
                    bad.append("%s:%d: names a path that does not exist: %s" % (path, no, name))
            for m in TEST_NAME.finditer(span):
                tests = test_file_names(repo) if tests is None else tests
                if m.group(1) not in tests:
                    bad.append("%s:%d: names a test file that does not exist: %s"
                               % (path, no, m.group(1)))
    return bad


def workdir(build):
    d = tempfile.mkdtemp(prefix="doctest-")
    for name in os.listdir(REPO):
        if name in ("build", ".git"):
            continue
        os.symlink(os.path.join(REPO, name), os.path.join(d, name))
    os.symlink(build, os.path.join(d, "build"))
    return d


def run_block(block, build, env):
    numbers = "numbers" in block.options
    timeout = 120
    for o in block.options:
        if o.startswith("timeout="):
            timeout = int(o.split("=", 1)[1])
    d = workdir(build)
    failures = []
    for no, cmd, expected in commands_of(block):
        try:
            p = subprocess.run(["bash", "-c", cmd], cwd=d, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout)
            text = p.stdout.decode("utf-8", "replace")
            rc = p.returncode
        except subprocess.TimeoutExpired:
            failures.append("%s:%d: `%s` ran past %d s" % (block.path, no, cmd, timeout))
            break
        actual = text.split("\n")
        while actual and not actual[-1].strip():
            actual.pop()
        if rc < 0 or rc >= 128:
            failures.append("%s:%d: `%s` died with status %d" % (block.path, no, cmd, rc))
        elif not matches(expected, actual, numbers):
            failures.append("%s:%d: `%s` printed something else (exit %d)\n--- expected\n%s\n--- got\n%s"
                            % (block.path, no, cmd, rc, "\n".join(expected), "\n".join(actual)))
    subprocess.run(["rm", "-rf", d])
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"), help="the build directory")
    ap.add_argument("--list", action="store_true", help="list the marked blocks, run nothing")
    ap.add_argument("files", nargs="*", help="markdown files (default README.md docs/*.md)")
    a = ap.parse_args()
    files = a.files or [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    build = os.path.abspath(a.build)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([build, os.path.join(build, "molgen"), env.get("PATH", "")])
    env["PYTHONPATH"] = "python"
    env["ATTN_LIBRARY"] = os.path.join(build, "libattn.so")
    env.setdefault("OPENBLAS_CORETYPE", "Haswell")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    blocks = [b for f in files for b in blocks_of(f)]
    if a.list:
        for b in blocks:
            print("%s:%d %s %s" % (os.path.relpath(b.path, REPO), b.line, " ".join(b.options),
                                   " ;; ".join(c[1].split("\n")[0] for c in commands_of(b))))
        return 0
    if not os.path.isdir(build):
        print("doctest_blocks: no build directory %s (--build DIR)" % build, file=sys.stderr)
        return 1
    links = [msg for f in files for msg in check_links(f) + check_paths(f)]
    for msg in links:
        print(msg)
    failed = 0
    for b in blocks:
        f = run_block(b, build, env)
        failed += bool(f)
        for msg in f:
            print(msg)
    print("doctest_blocks: %d of %d blocks match (%d commands); %d broken links or paths"
          % (len(blocks) - failed, len(blocks), sum(len(commands_of(b)) for b in blocks), len(links)))
    return 1 if failed or links else 0


if __name__ == "__main__":
    sys.exit(main())
