"""What molgen does with files an attacker (or the user) planted where it
writes, through the binary and molgen.report:

- symbolic links planted at the names of an output's temporaries
  ("<out>.tmp.<pid>" for the pids molgen will get, report.html.tmp) are
  never followed: the file they name keeps its bytes, the output is a new
  regular file with the output's content, the planted links stay as they
  were (sample --out and its .json, train --out, molgen.report);
- whatever sits at "<out>.lock" that is not molgen's own lock (a user's
  file, a hard link to another file, a symbolic link, a FIFO) is refused
  with one message naming it and left untouched, and the output is not
  written; molgen's own lock left by a killed run is taken over and
  removed at the end.
Oracles: the victims' bytes and inodes (os.stat / os.lstat), an
independent safetensors header parse, the line count of the samples."""
import json
import os
import stat
import struct
import subprocess

import pytest

from molgen_bin import ENV, TINY, molgen_binary, write_molecules  # noqa: E402

VICTIM = b"the victim's own bytes\n"


def run(args, timeout=180, cwd=None):
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd=cwd)


def one_error_line(p):
    assert 0 < p.returncode < 128, (p.returncode, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def smiles(tmp_path_factory):
    return write_molecules(tmp_path_factory.mktemp("data"), 200)[0]


@pytest.fixture(scope="module")
def model(smiles, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "tiny.safetensors")
    p = run(["train", "--data", smiles, "--steps", "3", "--out", path, "--quiet"] + TINY)
    assert p.returncode == 0, p.stderr
    return path


def last_pid():
    with open("/proc/sys/kernel/ns_last_pid") as f:
        return int(f.read())


def plant_and_run(d, names, args, span=500):
    """Plants, for the next `span` pids, each NAME.tmp.<pid> in d as a link
    to d/victim, then runs molgen ARGS (cwd d). Retried when the child's pid
    fell outside the planted range (a busy machine). -> (process, links)."""
    for _ in range(3):
        first = last_pid() + 1
        links = [os.path.join(d, "%s.tmp.%d" % (n, pid))
                 for n in names for pid in range(first, first + span)]
        for ln in links:
            os.symlink("victim", ln)
        p = subprocess.Popen([molgen_binary()] + args, cwd=d, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=300)
        if first <= p.pid < first + span:
            return subprocess.CompletedProcess(args, p.returncode, out, err), links
        for ln in links:
            os.unlink(ln)
    pytest.fail("molgen never started with a pid in the planted range")


def assert_untouched(d, links):
    victim = os.path.join(d, "victim")
    with open(victim, "rb") as f:
        assert f.read() == VICTIM
    for ln in links:
        assert os.readlink(ln) == "victim", ln


def test_sample_out_planted_temporary_links(model, tmp_path):
    d = str(tmp_path)
    with open(os.path.join(d, "victim"), "wb") as f:
        f.write(VICTIM)
    p, links = plant_and_run(d, ["s.smi", "s.smi.json"],
                             ["sample", "--model", model, "-n", "3", "--out", "s.smi",
                              "--threads", "1"])
    assert p.returncode == 0, p.stderr
    assert_untouched(d, links)
    out = os.path.join(d, "s.smi")
    assert stat.S_ISREG(os.lstat(out).st_mode)  # not a link to the victim
    with open(out) as f:
        assert len(f.read().splitlines()) == 3
    assert stat.S_ISREG(os.lstat(out + ".json").st_mode)
    with open(out + ".json") as f:
        json.load(f)
    # nothing of molgen's own left: only the planted links carry ".tmp."
    assert sorted(os.path.join(d, n) for n in os.listdir(d) if ".tmp." in n) == sorted(links)


def test_train_out_planted_temporary_links(smiles, tmp_path):
    d = str(tmp_path)
    with open(os.path.join(d, "victim"), "wb") as f:
        f.write(VICTIM)
    p, links = plant_and_run(d, ["ck.safetensors"],
                             ["train", "--data", smiles, "--steps", "2", "--out",
                              "ck.safetensors", "--quiet"] + TINY)
    assert p.returncode == 0, p.stderr
    assert_untouched(d, links)
    ck = os.path.join(d, "ck.safetensors")
    assert stat.S_ISREG(os.lstat(ck).st_mode)
    with open(ck, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert json.loads(raw[8:8 + n])["__metadata__"]["step"] == "2"


def test_report_planted_temporary_link(tmp_path, monkeypatch):
    from molgen import report
    d = str(tmp_path)
    with open(os.path.join(d, "victim"), "wb") as f:
        f.write(VICTIM)
    os.symlink("victim", os.path.join(d, "report.html.tmp"))  # the old fixed name
    page = "<!doctype html><title>r</title>\n"
    monkeypatch.setattr(report, "render", lambda directory, top, window: page)
    os.umask(old := os.umask(0o022))
    assert report.main([d]) == 0
    assert_untouched(d, [os.path.join(d, "report.html.tmp")])
    out = os.path.join(d, "report.html")
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 & ~old
    with open(out) as f:
        assert f.read() == page
    assert sorted(os.listdir(d)) == ["report.html", "report.html.tmp", "victim"]


# ---- 2. what sits at <out>.lock

def foreign_message(out):
    return ("--out %s: %s.lock is there and is not molgen's lock file (molgen keeps its lock "
            "at that name while it writes --out): refusing to touch it; move it away or choose "
            "another --out" % (out, out))


@pytest.mark.parametrize("kind", ["file", "hardlink", "symlink", "fifo"])
def test_foreign_lock_refused_untouched(model, tmp_path, kind):
    d = str(tmp_path)
    out = os.path.join(d, "poetry")
    lock = out + ".lock"
    other = os.path.join(d, "other.txt")
    with open(other, "wb") as f:
        f.write(VICTIM)
    if kind == "file":
        os.rename(other, lock)  # the user's own file at the name
        other = lock
    elif kind == "hardlink":
        os.link(other, lock)
    elif kind == "symlink":
        os.symlink("other.txt", lock)
    else:
        os.mkfifo(lock)
    before = os.lstat(lock)
    p = run(["sample", "--model", model, "-n", "3", "--out", out, "--threads", "1"], timeout=60)
    assert one_error_line(p) == "molgen sample: " + foreign_message(out)
    after = os.lstat(lock)
    assert (after.st_ino, after.st_mode, after.st_nlink) == (before.st_ino, before.st_mode,
                                                            before.st_nlink)
    if kind != "fifo":
        with open(other, "rb") as f:
            assert f.read() == VICTIM
    assert not os.path.exists(out)


def test_own_stale_lock_taken_over(model, tmp_path):
    """A lock molgen left when killed (its line, a pid that is gone, nobody
    holding it) is replaced, and removed at the end."""
    out = str(tmp_path / "s.smi")
    dead = subprocess.Popen(["true"])
    dead.wait()
    with open(out + ".lock", "w") as f:
        f.write("molgen lock pid %d\n" % dead.pid)
    p = run(["sample", "--model", model, "-n", "3", "--out", out, "--threads", "1"])
    assert p.returncode == 0, p.stderr
    with open(out) as f:
        assert len(f.read().splitlines()) == 3
    assert not os.path.exists(out + ".lock")


def test_lock_held_while_running_says_molgen(model, smiles, tmp_path):
    """The lock a running molgen holds is its line with its pid, one link."""
    out = str(tmp_path / "ck.safetensors")
    fifo = str(tmp_path / "loss.fifo")
    os.mkfifo(fifo)
    p = subprocess.Popen([molgen_binary(), "train", "--data", smiles, "--steps", "2", "--out",
                          out, "--loss-log", fifo] + TINY, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        for line in p.stderr:  # "model:" comes after the outputs were claimed
            if line.startswith("model:"):
                break
        with open(out + ".lock") as f:
            assert f.read() == "molgen lock pid %d\n" % p.pid
        assert os.stat(out + ".lock").st_nlink == 1
        q = run(["train", "--data", smiles, "--steps", "1", "--out", out] + TINY)
        assert "--out %s is being written by another molgen (pid %d)" % (out, p.pid) in \
            one_error_line(q)
    finally:
        with open(fifo, "rb") as f:
            f.read()
        p.communicate(timeout=300)
    assert p.returncode == 0
    assert not os.path.exists(out + ".lock")
