"""molgen optimize against hostile scorers and edited checkpoints: every
fault is one clear message and exit 1 (2 for usage), the state stays
resumable, nothing the scorer says reaches scored.csv or the checkpoint
unchecked, no process of the scorer outlives molgen.

The scorer is a plain Python script written here (no RDKit): score = the
first byte of md5(SMILES) mod 100 / 100, canonical= the SMILES itself, so
the test recomputes every score independently. MODE makes it misbehave at
its AT-th molecule. Runs: budget <= 48, batch 8, 1 thread.
"""
import csv
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time

import pytest

from molgen_bin import REPO, molgen_binary

PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")

SCORER = r'''
import hashlib, os, sys, time
mode, at = os.environ.get("MODE", ""), int(os.environ.get("AT", "3"))
out = sys.stdout.buffer
if mode == "fork":
    pid = os.fork()
    if pid == 0:
        time.sleep(600); os._exit(0)
    open(os.environ["PIDFILE"], "w").write(str(pid))
    os._exit(0)

if os.environ.get("PIDFILE") and mode != "fork":
    open(os.environ["PIDFILE"], "w").write(str(os.getpid()))

def requests():
    """(line, last line of what one read gave): molgen writes a request whole"""
    buf = b""
    while True:
        c = os.read(0, 1 << 16)
        if not c: return
        buf += c
        *done, buf = buf.split(b"\n")
        for k, l in enumerate(done):
            yield l.decode(), k == len(done) - 1 and not buf

n = 0
for s, last in requests():
    n += 1
    v = hashlib.md5(s.encode()).digest()[0] % 100 / 100
    r = b"%.2f\tcanonical=%s" % (v, s.encode())
    if mode == "allnan": r = b"nan"
    if mode == "scaffold": r += b"\tscaffold=C1CCCCC1"  # one diversity-filter bucket
    if n == at:
        if mode == "nul": r = b"0.5\x00trailing"
        elif mode == "utf8": r = b"0.5\tcanonical=C\xff\xfeC"
        elif mode == "cr": r = b"0.5\tcanonical=C\rC"
        elif mode == "long": r = b"0.5\tcanonical=" + b"C" * (10 << 20)
        elif mode.startswith("num:"): r = mode[4:].encode()
        elif mode.startswith("pad:"): r = mode[4:].encode() + b"\tcanonical=%s" % s.encode()
        elif mode == "sleep":
            open(os.environ["PIDFILE"] + ".sleeping", "w").close(); time.sleep(600)
        elif mode == "bigscaffold": r += b"\tscaffold=" + b"C" * 900000
        elif mode == "bigcanonical": r = b"0.5\tcanonical=" + b"C" * 1025
        elif mode == "bigcomps": r += b"".join(b"\tc%03d=0.5" % k for k in range(200))
    out.write(r + b"\n"); out.flush()
    if mode == "late" and last and at:
        # one line more, once molgen holds its first request's answers
        time.sleep(0.02); out.write(b"0.99\n"); out.flush(); at = 0
'''


def expected_score(smiles):
    return hashlib.md5(smiles.encode()).digest()[0] % 100 / 100


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    p = tmp_path_factory.mktemp("scorer") / "md5score.py"
    p.write_text(SCORER)
    return "%s %s" % (sys.executable, p)


def optimize(out, scorer, *args, env=None, resume=False, timeout=300):
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "1",
           "--resume" if resume else "--out", str(out)] + [str(a) for a in args]
    return subprocess.run(cmd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout)


def text(r):
    return r.stderr.decode("utf-8", "replace")


def read_scored(d):
    with open(d / "scored.csv", newline="") as f:
        return list(csv.DictReader(f))


RUN = ("--budget", 40, "--batch", 8, "--seed", 1, "--scorer-timeout", 20)


def assert_fault(r, d, words):
    """exit 1, exactly two lines: the fault (with words) and 'state saved'"""
    err = text(r)
    assert r.returncode == 1, err
    lines = [l for l in err.strip().splitlines() if not l.startswith("step ")]  # progress
    assert len(lines) == 2, err
    for w in words:
        assert w in lines[0], lines[0]
    assert "continue with --resume" in lines[1], err
    assert (d / "agent.safetensors").exists()


@pytest.mark.parametrize("mode,words", [
    ("nul", ["holds a NUL byte", "after '0.5'"]),       # was: taken as 0.5
    ("utf8", ["is not UTF-8 text"]),                    # was: "out of memory saving", no state
    ("cr", ["holds a control character"]),              # was: a raw CR inside scored.csv
    ("long", ["is longer than 1048576 bytes"]),         # was: a 10 MB canonical kept
    ("num:0x1p-2", ["'0x1p-2'", "does not start with a number"]),  # was: 0.25
])
def test_bad_reply_line_is_one_clear_error_and_resumable(tmp_path, scorer, mode, words):
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, env={"MODE": mode, "AT": "3"})
    assert_fault(r, d, words)
    r = optimize(d, scorer, resume=True)
    assert r.returncode == 0, text(r)
    rows = read_scored(d)
    assert len(rows) == 40
    for x in rows:
        assert x["canonical"] == x["smiles"] and float(x["score"]) == expected_score(x["smiles"])


@pytest.mark.parametrize("mode,words", [
    # was: kept; a 150-call run wrote a state nothing could read back
    ("bigscaffold", ["its scaffold= field is 900000 bytes, longer than 1024"]),
    ("bigcanonical", ["its canonical= field is 1025 bytes"]),
    ("bigcomps", ["its components take more than 1024 bytes"]),
])
def test_long_answer_field_is_refused_at_the_protocol(tmp_path, scorer, mode, words):
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, env={"MODE": mode, "AT": "3"})
    assert_fault(r, d, words + ["molecule 3 of the batch"])


def test_state_the_reader_would_refuse_is_not_written(tmp_path, scorer):
    """The writer refuses a header over the reader's limit (here lowered by
    the test hook) before writing: the previous state stays and resumes."""
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, "--save-every", 1, env={"MOLGEN_OPT_STATE_LIMIT": "6000"})
    err = text(r)
    assert r.returncode == 1, err
    assert "not written: the state of" in err and "the previous state is kept" in err, err
    kept = json.loads(read_meta(d / "agent.safetensors")["optimize"])
    assert 0 < kept["step"] and len(kept["molecules"]) < 40
    assert len(read_scored(d)) == len(kept["molecules"])  # the files of one save
    r = optimize(d, scorer, resume=True)
    assert r.returncode == 0, text(r)
    assert len(read_scored(d)) == 40


def read_meta(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n])["__metadata__"]


def test_line_after_the_answers_does_not_shift_the_next_batch(tmp_path, scorer):
    """A line more than asked, arriving after the request's answers: it would
    be read as the next request's first answer and shift every score."""
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, env={"MODE": "late"})
    assert_fault(r, d, ["more lines than molecules asked", "'0.99", "came before molecule 1"])
    rows = read_scored(d)
    assert len(rows) == 8  # step 0 kept, nothing of the shifted step
    for x in rows:
        assert float(x["score"]) == expected_score(x["smiles"])


@pytest.mark.parametrize("answer,value", [
    (" 0.5 ", 0.5), ("0.5  ", 0.5), ("00000.250", 0.25),
    ("0." + "0" * 70 + "1", 1e-71), (" nan ", None),
])
def test_score_with_spaces_or_zero_padding_is_read(tmp_path, scorer, answer, value):
    """was: "does not start with a number" (a trailing space, or a number of
    64 characters or more)"""
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 8, "--batch", 8, env={"MODE": "pad:" + answer, "AT": "2"})
    assert r.returncode == 0, text(r)
    rows = read_scored(d)
    got = [float(x["score"]) for x in rows if float(x["score"]) != expected_score(x["smiles"])]
    if value is None:
        assert got == []  # the molecule answered " nan " left out
    else:
        assert len(got) <= 1 and (got == [value] or expected_score(rows[1]["smiles"]) == value)


def test_scorer_that_reads_all_input_gets_a_hint(tmp_path):
    slurp = tmp_path / "slurp.py"
    slurp.write_text("import sys\nfor l in sys.stdin.read().splitlines(): print('0.5')\n")
    r = optimize(tmp_path / "run", "%s %s" % (sys.executable, slurp), *RUN[:-1], 2)
    assert r.returncode == 1 and "no answer" in text(r), text(r)
    assert "one that reads all its input before answering" in text(r), text(r)


def test_negative_zero_score_is_zero(tmp_path, scorer):
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 8, "--batch", 8, env={"MODE": "num:-0", "AT": "3"})
    assert r.returncode == 0, text(r)
    scores = [x["score"] for x in read_scored(d)]
    assert "0" in scores and "-0" not in scores


def test_scorer_children_do_not_outlive_molgen(tmp_path, scorer):
    """The scorer exits, its child keeps the pipes: its exit is seen at once
    (was: after --scorer-timeout, as "gave no answer") and the child, left
    behind before, is killed with the scorer's group."""
    d, pidfile = tmp_path / "run", tmp_path / "child.pid"
    t0 = time.time()
    r = optimize(d, scorer, *RUN[:-1], 60, env={"MODE": "fork", "PIDFILE": str(pidfile)})
    assert time.time() - t0 < 30, text(r)
    assert_fault(r, d, ["exited with status 0 before answering molecule 1",
                        "still holds its output open"])
    child = int(pidfile.read_text())
    alive = True
    for _ in range(50):
        try:
            os.kill(child, 0)
            with open("/proc/%d/stat" % child) as f:
                alive = f.read().split(")")[1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            alive = False
        if not alive:
            break
        time.sleep(0.1)
    if alive:
        os.kill(child, signal.SIGKILL)
    assert not alive, "the scorer's child %d outlived molgen" % child


def test_scorer_that_scores_nothing_is_an_error(tmp_path, scorer):
    """nan for every molecule: was `stop: collapse` and exit 0 after 20 steps"""
    d = tmp_path / "run"
    r = optimize(d, scorer, *RUN, env={"MODE": "allnan"})
    err = text(r)
    assert r.returncode == 1, err
    assert "the scorer could score nothing" in err and "nan to every one of the 32" in err, err
    assert "collapse" not in err
    # also when the run stops before 4 batches
    r = optimize(tmp_path / "run2", scorer, *RUN, "--max-steps", 1, env={"MODE": "allnan"})
    assert r.returncode == 1 and "nan to every one of the 8 " in text(r), text(r)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_for(path, seconds=120):
    t = time.time() + seconds
    while not os.path.exists(path):
        assert time.time() < t, "no %s" % path
        time.sleep(0.05)


def test_scorer_dies_with_a_killed_molgen(tmp_path, scorer):
    """SIGKILL of molgen (as mpirun's abort does) while the scorer works on
    a molecule: the scorer, in its own process group, was left running
    (PR_SET_PDEATHSIG now)."""
    pidfile = tmp_path / "scorer.pid"
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "1",
           "--out", str(tmp_path / "run"), "--budget", 100, "--batch", 8]
    p = subprocess.Popen([str(c) for c in cmd], env=dict(ENV, MODE="sleep", AT="12",
                                                          PIDFILE=str(pidfile)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(str(pidfile) + ".sleeping")
        pid = int(pidfile.read_text())
        p.kill()
        p.wait(timeout=30)
        t = time.time() + 5
        while alive(pid) and time.time() < t:
            time.sleep(0.05)
        gone = not alive(pid)
        if not gone:
            os.kill(pid, signal.SIGKILL)
        assert gone, "the scorer %d outlived a SIGKILLed molgen" % pid
    finally:
        if p.poll() is None:
            p.kill()


def test_two_sigints_during_the_save_leave_a_whole_state(tmp_path, scorer):
    """Signals that come while the state is written wait for the save (the
    test hook MOLGEN_OPT_SAVE_PAUSE holds it open between agent.safetensors
    and scored.csv); then exit 130 with a state that resumes. Was: the second
    SIGINT killed molgen mid-save."""
    d = tmp_path / "run"
    cmd = [molgen_binary(), "optimize", "--prior", PRIOR, "--scorer", scorer, "--threads", "1",
           "--out", str(d)] + [str(a) for a in RUN] + ["--save-every", "1"]
    # signals are held before agent.safetensors appears; the 5 s pause is
    # the window both must land in, however late this process wakes
    p = subprocess.Popen(cmd, env=dict(ENV, MOLGEN_OPT_SAVE_PAUSE="5"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(str(d / "agent.safetensors"))
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    err = err.decode("utf-8", "replace")
    assert p.returncode == 130, (p.returncode, err)
    assert "interrupted by signal 2" in err and "continue with --resume" in err, err
    state = json.loads(read_meta(d / "agent.safetensors")["optimize"])
    assert len(read_scored(d)) == len(state["molecules"]) > 0
    r = optimize(d, scorer, resume=True)
    assert r.returncode == 0, text(r)
    assert len(read_scored(d)) == 40


def test_diversity_filter_at_its_bucket_bound(tmp_path, scorer):
    """Every molecule in one scaffold bucket: a step's n new molecules fill it
    to n. --df-bucket n keeps their learning scores (the memory takes every
    molecule scoring > 0, at its score), --df-bucket n - 1 zeroes them all
    (an empty memory). Kills the bound off by one either way."""
    def memory(d, bucket):
        r = optimize(d, scorer, "--budget", 100, "--batch", 8, "--seed", 1, "--max-steps", 1,
                     "--df", "scaffold", "--df-bucket", bucket, "--df-min-score", 0,
                     "--memory", 50, "--replay", 0, env={"MODE": "scaffold"})
        assert r.returncode == 0, text(r)
        return json.loads(read_meta(d / "agent.safetensors")["optimize"])["memory"], \
            read_scored(d)
    mem, rows = memory(tmp_path / "a", 1000)
    n = len(rows)
    assert n >= 2
    want = sorted((i, expected_score(x["smiles"])) for i, x in enumerate(rows)
                  if expected_score(x["smiles"]) > 0)
    assert sorted((m, s) for m, s in mem) == want
    mem, _ = memory(tmp_path / "b", n)
    assert sorted((m, s) for m, s in mem) == want
    mem, _ = memory(tmp_path / "c", n - 1)
    assert mem == []


def test_missing_command_is_named(tmp_path):
    d = tmp_path / "run"
    r = optimize(d, "/nonexistent/scorer", *RUN)
    assert r.returncode == 1 and "status 127 (the shell found no such command)" in text(r), text(r)


@pytest.mark.parametrize("cmd", ["", "   "])
def test_empty_scorer_is_a_usage_error(tmp_path, cmd):
    d = tmp_path / "run"
    r = optimize(d, cmd, *RUN)
    assert r.returncode == 2 and "--scorer is empty" in text(r), text(r)
    assert not d.exists()


def test_new_run_does_not_overwrite_a_saved_one(tmp_path, scorer):
    d = tmp_path / "run"
    r = optimize(d, scorer, "--budget", 16, "--batch", 8)
    assert r.returncode == 0, text(r)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = optimize(d, scorer, "--budget", 16, "--batch", 8, "--seed", 9)
    assert r.returncode == 1 and "holds a run already" in text(r), text(r)
    assert "--resume %s" % d in text(r)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before


# ---------------------------------------------------------------- edited checkpoints

def rewrite_state(src, dst, edit):
    """dst = src with its "optimize" metadata JSON changed by edit(dict)"""
    b = open(src, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    o = json.loads(head["__metadata__"]["optimize"])
    edit(o)
    head["__metadata__"]["optimize"] = json.dumps(o)
    hb = json.dumps(head).encode()
    hb += b" " * (-len(hb) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(hb)) + hb + b[8 + n:])


@pytest.fixture(scope="module")
def saved(tmp_path_factory, scorer):
    d = tmp_path_factory.mktemp("saved") / "run"
    r = optimize(d, scorer, "--budget", 48, "--batch", 8, "--stop-after", 2)
    assert r.returncode == 0, text(r)
    return d


def setitem(path, value):
    def edit(o):
        x = o
        for k in path[:-1]:
            x = x[k]
        x[path[-1]] = value
    return edit


EDITS = [
    (setitem(["step"], -5), "the step counters"),
    (setitem(["step"], 10 ** 15), "the step counters"),
    (setitem(["adam_step"], -3), "the step counters"),        # was: NaN agent
    (setitem(["molecules", 0, 4], 7.0), "scored molecule 1 is malformed"),
    (setitem(["molecules", 0, 4], "a"), "scored molecule 1 is malformed"),
    (setitem(["molecules", 3, 8], 7), "scored molecule 4 is malformed"),
    (lambda o: o["molecules"][1].__setitem__(1, o["molecules"][0][1]),
     "scored molecule 2 is malformed"),
    (setitem(["molecules"], 5), "are not lists"),              # was: an empty message
    (setitem(["memory", 0, 0], 99), "memory entry 1 names no molecule"),
    (setitem(["memory", 0, 1], 5.0), "memory entry 1 is malformed"),
    (lambda o: o.__setitem__("memory", [o["memory"][0]] * 3), "repeats molecule"),
    (setitem(["options", "batch"], 0),
     "option \"batch\": bad value '0' for --batch (an integer in [1, 4096])"),
    (setitem(["options", "df"], 9), 'option "df" is 9: not one of 0..2'),
    (setitem(["options", "df_bucket"], -1),
     "option \"df_bucket\": bad value '-1' for --df-bucket"),
    (setitem(["options", "collapse_steps"], -1),
     "option \"collapse_steps\": bad value '-1' for --collapse-steps"),
    (setitem(["options", "seed"], "abc"), "bad value 'abc' for --seed (a decimal integer"),
    (setitem(["scorer"], 5), "the recorded scorer command is not a string"),
    # was: taken, then every --resume failed "row weight is not finite"
    (setitem(["molecules", 0, 5], 1e300),
     "scored molecule 1: its prior_nll 1e+300 is outside [0, 1e+06] nats"),
    (setitem(["molecules", 2, 5], -1e300),
     "scored molecule 3: its prior_nll -1e+300 is outside [0, 1e+06] nats"),
    (setitem(["molecules", 1, 6], 1.5e6),
     "scored molecule 2: its agent_nll 1.5e+06 is outside [0, 1e+06] nats"),
    (setitem(["molecules", 0, 5], -0.5), "scored molecule 1: its prior_nll -0.5 is outside"),
    (setitem(["molecules", 0, 5], "20"), "scored molecule 1: its prior_nll is not a number"),
]


@pytest.mark.parametrize("k", range(len(EDITS)))
def test_resume_refuses_an_edited_state(tmp_path, scorer, saved, k):
    edit, words = EDITS[k]
    d = tmp_path / "run"
    shutil.copytree(saved, d)
    rewrite_state(saved / "agent.safetensors", d / "agent.safetensors", edit)
    before = (d / "agent.safetensors").read_bytes()
    r = optimize(d, scorer, resume=True)
    err = text(r)
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert words in err and str(d / "agent.safetensors") + ": " in err, err
    assert (d / "agent.safetensors").read_bytes() == before


def test_resume_with_nlls_at_the_bound_runs(tmp_path, scorer, saved):
    """NLLs at the load bound (1e6 nats) in every memory molecule, which the
    replay rows train on: the run goes on to the end (the row weights and
    the loss stay finite) -- the bound is one the arithmetic takes"""
    d = tmp_path / "run"
    shutil.copytree(saved, d)

    def edit(o):
        assert o["memory"]
        for k, _ in o["memory"]:
            o["molecules"][k][5] = 1e6
            o["molecules"][k][6] = 1e6
    rewrite_state(saved / "agent.safetensors", d / "agent.safetensors", edit)
    r = optimize(d, scorer, resume=True)
    assert r.returncode == 0, text(r)
    assert len(read_scored(d)) == 48


def test_resume_of_an_unedited_copy_runs(tmp_path, scorer, saved):
    d = tmp_path / "run"
    shutil.copytree(saved, d)
    rewrite_state(saved / "agent.safetensors", d / "agent.safetensors", lambda o: None)
    r = optimize(d, scorer, resume=True)
    assert r.returncode == 0, text(r)
    assert len(read_scored(d)) == 48


# ---------------------------------------------------------------- the scorer on --resume

def test_resume_with_another_scorer_is_refused_unless_asked(tmp_path, scorer, saved):
    """was: --resume with another --scorer accepted silently, the command
    recorded nowhere"""
    assert json.loads(read_meta(saved / "agent.safetensors")["optimize"])["scorer"] == scorer
    d = tmp_path / "run"
    shutil.copytree(saved, d)
    other = scorer + " --another"  # the script ignores its arguments: the same scores
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = optimize(d, other, resume=True)
    err = text(r)
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert ("was scored by --scorer '%s', not '%s'" % (scorer, other)) in err, err
    assert "--scorer-changed" in err and str(d / "agent.safetensors") in err, err
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    r = optimize(d, other, "--scorer-changed", resume=True)
    err = text(r)
    assert r.returncode == 0, err
    assert ("note: --scorer-changed: the run was scored by '%s' so far; going on with '%s'"
            % (scorer, other)) in err, err
    assert json.loads(read_meta(d / "agent.safetensors")["optimize"])["scorer"] == other
    assert json.loads((d / "summary.json").read_text())["scorer"] == other
    assert len(read_scored(d)) == 48


def test_resume_of_a_state_without_a_scorer_record_is_a_note(tmp_path, scorer, saved):
    d = tmp_path / "run"
    shutil.copytree(saved, d)
    rewrite_state(saved / "agent.safetensors", d / "agent.safetensors",
                  lambda o: o.pop("scorer"))
    r = optimize(d, scorer, resume=True)
    err = text(r)
    assert r.returncode == 0, err
    assert "note: %s records no scorer command" % (d / "agent.safetensors") in err, err
    assert json.loads(read_meta(d / "agent.safetensors")["optimize"])["scorer"] == scorer
    assert len(read_scored(d)) == 48


def test_scorer_changed_without_resume_is_a_usage_error(tmp_path, scorer):
    r = optimize(tmp_path / "run", scorer, "--scorer-changed")
    assert r.returncode == 2 and "--scorer-changed goes with --resume" in text(r), text(r)


def test_scorer_command_that_is_not_utf8_is_recorded_escaped(tmp_path, scorer):
    """a JSON string must be UTF-8: the command's bytes >= 0x80 are recorded
    \\xNN (a plain json_string would fail every save)"""
    cmd = scorer + os.fsdecode(b" # caf\xe9")  # a shell comment in Latin-1
    d = tmp_path / "run"
    r = optimize(d, cmd, "--budget", 24, "--batch", 8, "--stop-after", 1)
    assert r.returncode == 0, text(r)
    assert json.loads(read_meta(d / "agent.safetensors")["optimize"])["scorer"] == \
        scorer + " # caf\\xe9"
    r = optimize(d, cmd, resume=True)
    assert r.returncode == 0 and "note" not in text(r), text(r)
    assert len(read_scored(d)) == 24
    r = optimize(d, scorer, "--budget", 32, resume=True)
    assert r.returncode == 1 and "not '%s'" % scorer in text(r), text(r)
