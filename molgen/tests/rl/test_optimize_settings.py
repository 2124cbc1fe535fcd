"""molgen optimize's settings table (molgen/rl/opt_settings.h): every line of
MG_OPT_SETTINGS is an option in --help, a key of the saved options (unless
FREE) that a resume reads back, and one range that the command line and the
resume reader enforce with the same words.

The rows are read from the header itself, so a new line is covered here
with no edit to this file. The oracle of each value is the header's range
and the value this test wrote, never the program's output."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

import pytest

from molgen_bin import REPO, molgen_binary

PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")
HEADER = os.path.join(REPO, "molgen", "rl", "opt_settings.h")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")
# a deterministic scorer: the share of N atoms, canonical= from RDKit
SCORER = r'''
import sys
from rdkit import Chem, RDLogger
RDLogger.DisableLog("rdApp.*")
for line in sys.stdin:
    s = line.rstrip("\n")
    if s.startswith("!randomize"):
        _, seed, k, smi = s.split("\t")
        print("\t".join([smi] * int(k)), flush=True)
        continue
    m = Chem.MolFromSmiles(s)
    if m is None or m.GetNumAtoms() == 0:
        print("nan", flush=True); continue
    n = sum(a.GetSymbol() == "N" for a in m.GetAtoms())
    print("%.6f\tcanonical=%s" % (n / m.GetNumAtoms(), Chem.MolToSmiles(m)), flush=True)
'''


def rows():
    """The header's lines: key, kind, cli, arg, lo, hi, bounds, resume."""
    text = open(HEADER).read()
    body = text[text.index("#define MG_OPT_SETTINGS(X)"):text.index("#define MG_OPT_CTYPE_U64")]
    body = re.sub(r"/\*.*?\*/", " ", body.replace("\\\n", " "), flags=re.S)
    body = " ".join(body.split())
    pat = re.compile(r'X\((\w+), (\w+), (\w+), "([^"]+)", "([^"]*)", ([^,]+), ([^,]+), ([^,]+), '
                     r'(\w+), (\w+),')
    out = []
    for m in pat.finditer(body):
        key, _, kind, cli, arg, _, lo, hi, bounds, resume = m.groups()
        num = lambda x: float(x.strip().rstrip("L"))
        out.append(dict(key=key, kind=kind, cli=cli, arg=arg, lo=num(lo), hi=num(hi),
                        bounds=bounds, resume=resume))
    assert len(out) == len(re.findall(r"\bX\(", body)), "a line of MG_OPT_SETTINGS this test cannot read"
    return out


ROWS = rows()
SAVED = [r for r in ROWS if r["resume"] != "FREE"]


def run(*args):
    return subprocess.run([molgen_binary(), "optimize", "--threads", "1"] + [str(a) for a in args],
                          env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=600)


def read_state(path):
    """The agent file's header and its "optimize" JSON."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    return head, json.loads(head["__metadata__"]["optimize"])


def write_state(src, dst, options):
    """src's agent file with its saved options replaced (a hand edit)."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    state = json.loads(head["__metadata__"]["optimize"])
    state["options"] = options
    head["__metadata__"]["optimize"] = json.dumps(state)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run of budget 200, batch 16, stopped after step 1."""
    pytest.importorskip("rdkit")
    d = tmp_path_factory.mktemp("opt_settings")
    (d / "score.py").write_text(SCORER)
    scorer = "%s %s" % (sys.executable, d / "score.py")
    r = run("--prior", PRIOR, "--scorer", scorer, "--out", d / "run", "--budget", 200, "--batch",
            16, "--seed", 3, "--memory", 20, "--replay", 4, "--stop-after", 1)
    assert r.returncode == 0, r.stderr
    return d, scorer


def test_every_row_is_an_option_in_help():
    r = run("--help")
    assert r.returncode == 0
    entries = {}  # --help's entries, each from its option's line to the next option's
    for e in re.split(r"\n  (?=--)", r.stdout.split("\nOptions:\n", 1)[1]):
        words = " ".join(e.split())
        entries[words.split(" ", 1)[0]] = words
    for row in ROWS:
        e = entries.get("--" + row["cli"])
        assert e and e.startswith("--%s %s " % (row["cli"], row["arg"])), row["cli"]
        assert ("[same on resume]" in e) == (row["resume"] == "SAME"), row["cli"]


def test_saved_options_are_the_saved_rows(saved):
    d, _ = saved
    _, state = read_state(str(d / "run" / "agent.safetensors"))
    assert sorted(state["options"]) == sorted(r["key"] for r in SAVED)
    summary = json.load(open(str(d / "run" / "summary.json")))
    assert summary["options"] == state["options"]
    o = state["options"]
    assert (o["seed"], o["budget"], o["batch"], o["memory"], o["replay"]) == ("3", 200, 16, 20, 4)


def other_value(row, v):
    """Another value in row's range than the saved v, as JSON would hold it."""
    if row["kind"] == "U64":
        return str(int(v) + 1)
    if row["kind"] == "WORD":
        words = row["arg"].split("|")[: int(row["hi"]) + 1]
        return words[(words.index(v) + 1) % len(words)]
    if row["key"] == "ga_pool":  # 1 is refused inside the range: a child needs two parents
        return 2 if v != 2 else 3
    if row["kind"] in ("INT", "I64", "INDEX"):
        return v + 1 if v + 1 <= row["hi"] else v - 1
    return v / 2 if v > 0 else (row["lo"] + row["hi"]) / 2


def test_every_saved_row_is_read_back(saved):
    """Each saved key edited to another valid value: the resumed run holds
    the edited values (its summary), so each key reaches its field."""
    d, scorer = saved
    run_dir = d / "edited"
    shutil.copytree(str(d / "run"), str(run_dir))
    agent = str(run_dir / "agent.safetensors")
    _, state = read_state(agent)
    edited = {r["key"]: other_value(r, state["options"][r["key"]]) for r in SAVED}
    assert all(edited[k] != state["options"][k] for k in edited)
    write_state(agent, agent, edited)
    r = run("--prior", PRIOR, "--scorer", scorer, "--resume", run_dir, "--max-steps", 1)
    assert r.returncode == 0, r.stderr
    _, after = read_state(agent)
    assert after["options"] == edited
    assert json.load(open(str(run_dir / "summary.json")))["options"] == edited


def outside(row):
    """A value just outside row's range, as text and as JSON, or None."""
    if row["kind"] == "U64":
        return "-1", "-1"
    if row["kind"] == "WORD":
        return "fp64", "fp64"
    if row["kind"] in ("INT", "I64"):
        v = int(row["hi"]) + 1
        return str(v), v
    if row["kind"] == "F64":
        v = row["lo"] if row["bounds"] in ("MG_OPEN_LO", "MG_OPEN") else row["hi"] * 2
        return "%.17g" % v, v
    return None  # INDEX: the command line takes words, the file an index


@pytest.mark.parametrize("row", [r for r in SAVED if outside(r)], ids=lambda r: r["cli"])
def test_out_of_range_refused_alike_by_command_line_and_resume(saved, row, tmp_path):
    d, scorer = saved
    text, value = outside(row)
    cli = run("--prior", PRIOR, "--scorer", scorer, "--out", tmp_path / "x",
              "--%s" % row["cli"], text)
    assert cli.returncode == 2
    said = re.search(r"bad value .*?\)", cli.stderr)
    assert said and ("for --%s (" % row["cli"]) in said.group(0), cli.stderr
    run_dir = tmp_path / "edited"
    shutil.copytree(str(d / "run"), str(run_dir))
    agent = str(run_dir / "agent.safetensors")
    _, state = read_state(agent)
    write_state(agent, agent, dict(state["options"], **{row["key"]: value}))
    res = run("--prior", PRIOR, "--scorer", scorer, "--resume", run_dir)
    assert res.returncode != 0
    assert said.group(0) in res.stderr, (cli.stderr, res.stderr)
    assert 'option "%s"' % row["key"] in res.stderr


def test_saved_filter_index_outside_its_kinds_is_refused(saved, tmp_path):
    d, scorer = saved
    run_dir = tmp_path / "edited"
    shutil.copytree(str(d / "run"), str(run_dir))
    agent = str(run_dir / "agent.safetensors")
    _, state = read_state(agent)
    write_state(agent, agent, dict(state["options"], df=3))
    res = run("--prior", PRIOR, "--scorer", scorer, "--resume", run_dir)
    assert res.returncode != 0
    assert 'option "df" is 3: not one of 0..2' in res.stderr, res.stderr


def test_resume_continues_bit_for_bit(saved, tmp_path):
    """Stopped after step 1 and resumed = the run without a stop."""
    d, scorer = saved
    run_dir = tmp_path / "resumed"
    shutil.copytree(str(d / "run"), str(run_dir))
    r = run("--prior", PRIOR, "--scorer", scorer, "--resume", run_dir, "--max-steps", 3)
    assert r.returncode == 0, r.stderr
    r = run("--prior", PRIOR, "--scorer", scorer, "--out", tmp_path / "whole", "--budget", 200,
            "--batch", 16, "--seed", 3, "--memory", 20, "--replay", 4, "--max-steps", 3)
    assert r.returncode == 0, r.stderr
    for name in ("scored.csv", "best.smi", "agent.safetensors"):
        with open(str(run_dir / name), "rb") as a, open(str(tmp_path / "whole" / name), "rb") as b:
            assert a.read() == b.read(), name
