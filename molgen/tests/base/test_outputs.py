"""Where molgen's outputs go, through the binary:

- an existing FIFO or character device as --out is written through (a
  reader gets the very bytes a regular file gets) and never replaced; so is
  the process's own standard output under another name (/dev/fd/1); a
  checkpoint (train --out) refuses them;
- a symbolic link as --out is kept: the file it names (links followed) is
  replaced atomically, a dangling link's target is created;
- no output is the same file as an input or as another output (--out over
  --augment-file, --loss-log / --debug-dump-rows over the --init model, the
  --data file, the --resume checkpoint, each other);
- a second molgen writing an output being written (two trains, two
  --resume of one checkpoint, a sample or score under a held lock, an
  mpirun job) is refused at start, naming the holder's pid, and the first
  completes with a checkpoint that loads.
Oracles: the bytes a regular --out gets for the same seed, os.stat, an
independent safetensors header parse, and fcntl.flock held by the test."""
import fcntl
import hashlib
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import threading

import pytest

from molgen_bin import ENV, TINY, molgen_binary, write_molecules  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
ROOT = os.geteuid() == 0


def run(args, timeout=120, **kw):
    kw.setdefault("capture_output", True)
    return subprocess.run([molgen_binary()] + args, text=True, timeout=timeout, env=ENV, **kw)


def start(args):
    """molgen ARGS in the background, stderr a pipe read line by line."""
    return subprocess.Popen([molgen_binary()] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def wait_for_line(p, prefix):
    """Reads p's stderr until a line starting with prefix (all lines read)."""
    lines = []
    for line in p.stderr:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError("no line %r from molgen: %s" % (prefix, "".join(lines)))


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def one_error_line(p):
    assert 0 < p.returncode < 128, (p.returncode, p.stderr)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


def st_header(path):
    """A safetensors file's header, checked independently of molgen: the
    8-byte length, the JSON, the tensors' data ending at the end of file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
    assert 8 + n + end == len(raw), path
    return h


def no_leftovers(d):
    """No temporary or lock file of molgen left in directory d."""
    return [f for f in os.listdir(d) if ".tmp." in f or f.endswith(".lock")]


class FifoReader(threading.Thread):
    """Reads a FIFO to its end, as `cat f > got` would. A hard link kept
    beside it lets the test unblock the reader when molgen never opened the
    FIFO (the old binary renamed a file over its name)."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.data = path, b""
        self.keep = path + ".keep"
        os.link(path, self.keep)
        self.start()

    def run(self):
        with open(self.path, "rb") as f:
            self.data = f.read()

    def finish(self, timeout=60):
        self.join(timeout if self.data else 5)
        if self.is_alive():  # nobody wrote: open and close a writer ourselves
            os.close(os.open(self.keep, os.O_WRONLY | os.O_NONBLOCK))
            self.join(timeout)
        os.unlink(self.keep)
        return self.data


@pytest.fixture(scope="module")
def smiles(tmp_path_factory):
    return write_molecules(tmp_path_factory.mktemp("data"), 300)[0]


@pytest.fixture(scope="module")
def model(smiles, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model") / "tiny.safetensors")
    run(["train", "--data", smiles, "--steps", "4", "--out", path, "--quiet"] + TINY,
        capture_output=True).check_returncode()
    return path


def samples_oracle(model, tmp_path, n=5, seed=7):
    """The bytes `sample` writes to a regular file for this seed."""
    out = str(tmp_path / "oracle.smi")
    p = run(["sample", "--model", model, "-n", str(n), "--seed", str(seed), "--out", out])
    assert p.returncode == 0, p.stderr
    data = open(out, "rb").read()
    assert data.count(b"\n") == n
    os.unlink(out)
    os.unlink(out + ".json")
    return data


# ---- 1. FIFOs, devices and stdout as outputs: written through, never replaced

def test_sample_out_fifo_written_through(model, tmp_path):
    want = samples_oracle(model, tmp_path)
    fifo = str(tmp_path / "f")
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    p = run(["sample", "--model", model, "-n", "5", "--seed", "7", "--out", fifo])
    got = reader.finish()
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced"
    assert got == want
    assert "no sidecar" in p.stderr and not os.path.exists(fifo + ".json")
    assert no_leftovers(tmp_path) == []


@pytest.mark.skipif(not ROOT, reason="mknod of a character device needs root")
def test_score_out_character_device(model, smiles, tmp_path):
    null = str(tmp_path / "mynull")
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    p = run(["score", "--model", model, "--smiles", smiles, "--out", null, "--quiet"])
    assert p.returncode == 0, p.stderr
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    # /dev/full: written through, so its error is molgen's error
    full = str(tmp_path / "myfull")
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    p = run(["score", "--model", model, "--smiles", smiles, "--out", full, "--quiet"])
    assert "No space left on device" in one_error_line(p)
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    assert no_leftovers(tmp_path) == []


# Not /dev/stdout itself: as root the old binary renamed its temporary over
# it, replacing the machine's /dev/stdout link. /dev/fd/1 and /proc/self/fd/1
# name the same descriptor and cannot be replaced (their directory takes no
# file), so the old binary fails on them instead.
@pytest.mark.parametrize("name", ["-", "/dev/fd/1", "/proc/self/fd/1"])
def test_sample_out_stdout_by_name(model, tmp_path, name):
    want = samples_oracle(model, tmp_path)
    p = subprocess.run([molgen_binary(), "sample", "--model", model, "-n", "5", "--seed", "7",
                        "--out", name], capture_output=True, env=ENV, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == want  # the samples alone: no path line after them
    # stdout redirected to a regular file: written through the descriptor,
    # the file stays the one the shell opened
    red = tmp_path / "red.smi"
    with open(red, "wb") as f:
        f.write(b"kept\n")
        f.flush()
        ino = os.fstat(f.fileno()).st_ino
        p = subprocess.run([molgen_binary(), "sample", "--model", model, "-n", "5", "--seed",
                            "7", "--out", name], stdout=f, stderr=subprocess.PIPE, env=ENV,
                           timeout=120)
    assert p.returncode == 0, p.stderr
    assert os.stat(red).st_ino == ino
    assert red.read_bytes() == b"kept\n" + want


def test_attention_out_fifo(model, tmp_path):
    d = tmp_path / "att"
    d.mkdir()
    svg = str(d / "attention.svg")
    os.mkfifo(svg)
    reader = FifoReader(svg)
    p = run(["attention", "--model", model, "--smiles", "CCO", "--out", str(d)])
    got = reader.finish()
    assert p.returncode == 0, p.stderr
    assert stat.S_ISFIFO(os.lstat(svg).st_mode)
    assert b"<svg" in got and got.rstrip().endswith(b"</svg>")
    assert (d / "attention_heads.tsv").read_text().count("\n") >= 2
    assert no_leftovers(d) == []


@pytest.mark.parametrize("kind", ["fifo", "chardev"])
def test_train_out_special_refused(smiles, tmp_path, kind):
    out = str(tmp_path / "ck")
    if kind == "fifo":
        os.mkfifo(out)
    elif ROOT:
        os.mknod(out, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        pytest.skip("mknod of a character device needs root")
    p = run(["train", "--data", smiles, "--steps", "2", "--out", out] + TINY)
    line = one_error_line(p)
    what = "a FIFO" if kind == "fifo" else "a character device"
    assert "--out %s is %s" % (out, what) in line and "give a regular file" in line
    mode = os.lstat(out).st_mode
    assert stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)
    assert no_leftovers(tmp_path) == []


# ---- 1. symbolic links: the link is kept, the file it names replaced

def test_symlink_out_kept(model, smiles, tmp_path):
    want = samples_oracle(model, tmp_path)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.smi").write_text("old\n")
    os.symlink("sub/t.smi", tmp_path / "lk")  # relative, then a link to the link
    os.symlink("lk", tmp_path / "lk2")
    p = run(["sample", "--model", model, "-n", "5", "--seed", "7", "--out", str(tmp_path / "lk2")])
    assert p.returncode == 0, p.stderr
    assert os.readlink(tmp_path / "lk2") == "lk" and os.readlink(tmp_path / "lk") == "sub/t.smi"
    assert (sub / "t.smi").read_bytes() == want
    # a checkpoint through a dangling link: its target is created, the link kept
    link = tmp_path / "ck.safetensors"
    os.symlink("sub/real.safetensors", link)
    p = run(["train", "--data", smiles, "--steps", "2", "--out", str(link), "--quiet"] + TINY)
    assert p.returncode == 0, p.stderr
    assert os.path.islink(link) and st_header(sub / "real.safetensors")["__metadata__"]["step"] == "2"
    # --resume through the link writes back through it
    p = run(["train", "--resume", str(link), "--steps", "4", "--quiet"])
    assert p.returncode == 0, p.stderr
    assert os.path.islink(link) and st_header(sub / "real.safetensors")["__metadata__"]["step"] == "4"
    assert no_leftovers(tmp_path) == [] and no_leftovers(sub) == []


# ---- 2. an output over an input, or over another output

def randomize(data, out):
    pytest.importorskip("rdkit.Chem")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    p = subprocess.run([sys.executable, "-m", "molgen.randomize_smiles", str(data), str(out),
                        "--k", "2", "--seed", "1", "--jobs", "1"], capture_output=True,
                       text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr


def test_out_over_augment_file_refused(smiles, tmp_path):
    aug = tmp_path / "mols.aug"
    randomize(smiles, aug)
    before = digest(aug)
    p = run(["train", "--data", smiles, "--augment", "randomized", "--augment-file", str(aug),
             "--steps", "2", "--out", str(aug)] + TINY)
    line = one_error_line(p)
    assert "--out %s is the --augment-file file" % aug in line and "same file" in line
    assert digest(aug) == before


@pytest.mark.parametrize("log", ["--loss-log", "--debug-dump-rows"])
@pytest.mark.parametrize("over", ["--init", "--data"])
def test_log_over_input_refused(model, smiles, tmp_path, log, over):
    init = tmp_path / "init.safetensors"
    shutil.copy(model, init)
    data = tmp_path / "d.smi"
    shutil.copy(smiles, data)
    target = init if over == "--init" else data
    before = digest(target)
    p = run(["train", "--init", str(init), "--data", str(data), "--steps", "2",
             "--out", str(tmp_path / "ft.safetensors"), log, str(target)] + TINY)
    line = one_error_line(p)
    assert "%s %s is the %s file" % (log, target, over) in line and "same file" in line
    assert digest(target) == before
    st_header(init)  # the model still loads


def test_log_over_resume_and_outputs_refused(model, smiles, tmp_path):
    ck = tmp_path / "ck.safetensors"
    shutil.copy(model, ck)
    before = digest(ck)
    # --resume's checkpoint written elsewhere: an input, which no log may be
    p = run(["train", "--resume", str(ck), "--steps", "6", "--out", str(tmp_path / "o"),
             "--loss-log", str(ck)])
    assert "--loss-log %s is the --resume file" % ck in one_error_line(p)
    # --resume in place: --out, which no other output may be
    p = run(["train", "--resume", str(ck), "--steps", "6", "--debug-dump-rows", str(ck)])
    assert "are the same file" in one_error_line(p)
    assert digest(ck) == before
    # two logs into one new file, named two ways
    log = tmp_path / "both.log"
    p = run(["train", "--data", smiles, "--steps", "2", "--out", str(tmp_path / "n"),
             "--loss-log", str(log), "--debug-dump-rows", str(tmp_path / "." / "both.log")] + TINY)
    assert "are the same file" in one_error_line(p)
    assert not log.exists() and not (tmp_path / "n").exists()


def test_resume_outputs_over_its_data_refused(smiles, tmp_path):
    """--resume without --data reads the data file its checkpoint names."""
    data = tmp_path / "d.smi"
    shutil.copy(smiles, data)
    ck = str(tmp_path / "ck.safetensors")
    assert run(["train", "--data", str(data), "--steps", "2", "--out", ck, "--quiet"]
               + TINY).returncode == 0
    before = digest(data)
    for opt in ("--out", "--loss-log"):
        p = run(["train", "--resume", ck, "--steps", "4", "--quiet", opt, str(data)])
        line = one_error_line(p)
        assert "%s %s is the --data file" % (opt, data) in line and "same file" in line
        assert digest(data) == before
    assert st_header(ck)["__metadata__"]["step"] == "2"


# ---- 5. two writers of one output

def locked_train(args, tmp_path):
    """train ARGS with a FIFO --loss-log: it takes its output's lock, then
    blocks opening the FIFO until the test reads it. Returns (process, FIFO)."""
    fifo = str(tmp_path / "loss.fifo")
    os.mkfifo(fifo)
    p = start(["train"] + args + ["--loss-log", fifo])
    try:
        wait_for_line(p, "model:")  # printed after the outputs were claimed
    except BaseException:
        p.kill()
        p.wait()
        raise
    return p, fifo


def finish(p, fifo):
    """Reads p's FIFO loss log (p trains on) and waits for it: (rc, stdout, log)."""
    reader = FifoReader(fifo)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, reader.finish(), err


def test_two_trains_one_out(smiles, tmp_path):
    out = str(tmp_path / "ck.safetensors")
    first, fifo = locked_train(["--data", smiles, "--steps", "6", "--out", out] + TINY, tmp_path)
    try:
        second = run(["train", "--data", smiles, "--steps", "3", "--out", out] + TINY)
    finally:
        rc, stdout, log, err = finish(first, fifo)
    line = one_error_line(second)
    assert line == ("molgen train: --out %s is being written by another molgen (pid %d); "
                    "refusing to start" % (out, first.pid))
    assert rc == 0, err
    assert json.loads(stdout.splitlines()[-1])["step"] == 6
    assert log.count(b"\n") == 6  # one loss line per step
    assert st_header(out)["__metadata__"]["step"] == "6"
    assert no_leftovers(tmp_path) == []


def test_two_resumes_one_checkpoint(model, tmp_path):
    ck = str(tmp_path / "ck.safetensors")
    shutil.copy(model, ck)  # 4 steps done
    first, fifo = locked_train(["--resume", ck, "--steps", "8", "--threads", "1"], tmp_path)
    try:
        second = run(["train", "--resume", ck, "--steps", "12"])
    finally:
        rc, stdout, log, err = finish(first, fifo)
    line = one_error_line(second)
    assert "--out %s is being written by another molgen (pid %d)" % (ck, first.pid) in line
    assert rc == 0, err
    assert st_header(ck)["__metadata__"]["step"] == "8"
    p = run(["score", "--model", ck, "--smiles", "-", "--quiet"], input="CCO\n")
    assert p.returncode == 0 and p.stdout.count("\n") >= 1, p.stderr
    assert no_leftovers(tmp_path) == []


def hold_lock(path):
    """Takes path's lock as a molgen would: (fd, its line written)."""
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"molgen lock pid %d\n" % os.getpid())
    return fd


def test_held_lock_refuses_sample_and_score(model, smiles, tmp_path):
    out = str(tmp_path / "s.smi")
    fd = hold_lock(out)
    try:
        want = "--out %s is being written by another molgen (pid %d); refusing to start" % (
            out, os.getpid())
        p = run(["sample", "--model", model, "-n", "3", "--out", out])
        assert want in one_error_line(p)
        p = run(["score", "--model", model, "--smiles", smiles, "--out", out])
        assert want in one_error_line(p)
        assert not os.path.exists(out) and not os.path.exists(out + ".json")
        # the same file through a link is the same lock
        os.symlink("s.smi", tmp_path / "alias.smi")
        p = run(["sample", "--model", model, "-n", "3", "--out", str(tmp_path / "alias.smi")])
        assert "being written by another molgen (pid %d)" % os.getpid() in one_error_line(p)
    finally:
        os.close(fd)
    # a lock file nobody holds (one a killed run left) is taken over
    p = run(["sample", "--model", model, "-n", "3", "--out", out])
    assert p.returncode == 0, p.stderr
    assert open(out).read().count("\n") == 3
    assert no_leftovers(tmp_path) == []


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")
def test_held_lock_refuses_mpirun_train(smiles, tmp_path):
    out = str(tmp_path / "ck.safetensors")
    fd = hold_lock(out)
    try:
        p = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "2",
                            molgen_binary(), "train", "--data", smiles, "--steps", "2", "--out",
                            out] + TINY, capture_output=True, text=True, timeout=180, env=ENV)
    finally:
        os.close(fd)
    assert p.returncode != 0
    msgs = [l for l in p.stderr.splitlines() if "being written by another molgen" in l]
    # one message, from rank 0 (which checks the outputs), named as every
    # message of an mpirun job is: "molgen CMD: rank K of N: ..."
    assert msgs == ["molgen train: rank 0 of 2: --out %s is being written by another molgen "
                    "(pid %d); refusing to start" % (out, os.getpid())], p.stderr
    assert not os.path.exists(out)
