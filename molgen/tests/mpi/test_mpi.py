"""molgen under `mpirun -np N`, each test a few mpirun jobs of a
tiny model with a time bound. The oracle is the single process: N ranks
with global batch G must train like one process with batch G (the same
batches, losses to fp32 summation order, parameters to a stated bound),
and sample the very same file. Run by ctest (molgen/CMakeLists.txt) when
MPI was found; skipped without mpirun."""
import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

# molgen_bin (molgen/tests) and the molgen package (python/): on sys.path
# through molgen/tests/conftest.py, so this file also runs alone
from molgen_bin import molgen_binary, write_molecules
from molgen.torch_model import load_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed (openmpi-bin)")
MPI = [MPIRUN or "mpirun", "--oversubscribe", "--allow-run-as-root"]
ENV = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OMP_WAIT_POLICY="PASSIVE")
ENV.pop("ATTN_NUM_THREADS", None)
TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--batch-size", "16",
        "--no-progress", "--quiet", "--threads", "1", "--seed", "3", "--ckpt-every", "0"]
# Bounds, measured (2-core host, 300 steps): losses agree to 2e-7 relative,
# parameters to 4e-7 absolute; the bounds leave room for other summation
# orders of Open MPI's reduction and of OpenBLAS. Not compared: the key
# bias (in_proj_bias[d:2d]), whose exact gradient is 0 (adding q.b_k to all
# of a query's scores leaves the softmax unchanged): its computed gradient
# is rounding noise, which AdamW's normalised step turns into a random walk
# of ~lr per step, different for any other summation order (measured 1e-3
# apart after 300 steps) and without effect on the model's outputs.
LOSS_RTOL = 1e-5
PARAM_ATOL = 1e-5


def mpirun(np_, args, timeout=180, **kw):
    return subprocess.run(MPI + ["-np", str(np_), molgen_binary()] + args, capture_output=True,
                          text=True, timeout=timeout, env=ENV, **kw)


def alone(args, timeout=180):
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def ok(p):
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p


def loss_log(path):
    """[(step, loss, tokens, grad norm, batch hash)]"""
    rows = []
    for line in open(path):
        s, l, n, g, h = line.split()
        rows.append((int(s), float(l), int(n), float(g), h))
    return rows


def params(path):
    t, _ = load_safetensors(path)
    return {k: v for k, v in t.items() if not k.startswith("optim.")}


def molgen_lines(stderr, cmd):
    return [l for l in stderr.splitlines() if l.startswith("molgen %s:" % cmd)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_molecules(tmp_path_factory.mktemp("mpi"), 2000)[0]


def same_training(a, b, steps):
    """Loss logs a, b: the same batches and token counts at every step,
    losses and gradient norms to fp32 summation-order tolerance."""
    la, lb = loss_log(a), loss_log(b)
    assert [r[0] for r in la] == list(range(1, steps + 1))
    assert [r[0] for r in lb] == [r[0] for r in la]
    assert [r[4] for r in la] == [r[4] for r in lb], "different batches"
    assert [r[2] for r in la] == [r[2] for r in lb], "different token counts"
    l1, l2 = np.array([r[1] for r in la]), np.array([r[1] for r in lb])
    g1, g2 = np.array([r[3] for r in la]), np.array([r[3] for r in lb])
    assert np.max(np.abs(l1 - l2) / l1) < LOSS_RTOL, np.max(np.abs(l1 - l2) / l1)
    assert np.max(np.abs(g1 - g2) / g1) < 100 * LOSS_RTOL, np.max(np.abs(g1 - g2) / g1)
    assert l1[-1] < 0.6 * l1[0]  # it learned: the comparison is not of two flat lines


def same_params(a, b, atol=PARAM_ATOL):
    pa, pb = params(a), params(b)
    assert sorted(pa) == sorted(pb)
    for k in pa:
        if k.endswith("attn.in_proj_bias"):
            d = pa[k].shape[0] // 3
            pa[k], pb[k] = np.delete(pa[k], np.s_[d:2 * d]), np.delete(pb[k], np.s_[d:2 * d])
    worst = max(float(np.max(np.abs(pa[k] - pb[k]))) for k in pa)
    assert worst < atol, worst
    return worst


@pytest.mark.parametrize("ranks", [2, 3])
def test_train_equals_one_process(data, tmp_path, ranks):
    """N ranks with global batch 16 (3 ranks: 6 + 5 + 5 rows) = 1 process
    with batch 16 over 300 steps (2 ranks; 150 at 3, the slower job)."""
    steps = 300 if ranks == 2 else 150
    args = ["train", "--data", data, "--steps", str(steps), "--val-every", "50"] + TINY
    one, many = tmp_path / "one", tmp_path / "many"
    p1 = ok(alone(args + ["--out", str(one) + ".st", "--loss-log", str(one) + ".log"]))
    pn = ok(mpirun(ranks, args + ["--out", str(many) + ".st", "--loss-log", str(many) + ".log"]))
    same_training(str(one) + ".log", str(many) + ".log", steps)
    same_params(str(one) + ".st", str(many) + ".st")
    # one summary line (rank 0's), validation reduced over the ranks
    assert len(pn.stdout.strip().splitlines()) == 1
    import json
    s1, sn = json.loads(p1.stdout), json.loads(pn.stdout)
    assert sn["ranks"] == ranks and "ranks" not in s1
    assert abs(s1["val_loss"] - sn["val_loss"]) < 1e-4 * s1["val_loss"]
    assert abs(s1["first_val_loss"] - sn["first_val_loss"]) < 1e-6 * s1["first_val_loss"]


@pytest.mark.parametrize("ranks", [2, 3])
def test_dropout_train_equals_one_process(data, tmp_path, ranks):
    """With dropout 0.1 (embedding, residual and attention) too: every mask
    is a function of the global batch row, so N ranks drop what one process
    with the whole batch drops (3 ranks: 6 + 5 + 5 rows, attention chunks
    that start off the single process's multiples of 8)."""
    args = ["train", "--data", data, "--steps", "100", "--val-every", "50",
            "--dropout", "0.1"] + TINY
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    ok(alone(args + ["--out", one + ".st", "--loss-log", one + ".log"]))
    ok(mpirun(ranks, args + ["--out", many + ".st", "--loss-log", many + ".log"]))
    same_training(one + ".log", many + ".log", 100)
    same_params(one + ".st", many + ".st")


def test_conditional_train_equals_one_process(data, tmp_path):
    """A conditional model (--condition, dropped conditions) at 3 ranks: each
    rank's rows get their own conditions and drops, so it trains like one
    process too."""
    csv = tmp_path / "c.csv"
    mols = open(data).read().split()
    csv.write_text("smiles,n\n" + "".join("%s,%d\n" % (m, len(m)) for m in mols))
    args = ["train", "--data", str(csv), "--condition", "n", "--condition-drop", "0.2",
            "--steps", "100", "--val-every", "50"] + TINY
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    ok(alone(args + ["--out", one + ".st", "--loss-log", one + ".log"]))
    ok(mpirun(3, args + ["--out", many + ".st", "--loss-log", many + ".log"]))
    same_training(one + ".log", many + ".log", 100)
    same_params(one + ".st", many + ".st")


def test_scaffold_train_and_sample_equal_one_process(data, tmp_path):
    """Scaffold prefixes (--scaffold-column: rows of different widths, each
    rank's slice of the batch's prefixes) at 3 ranks train like one process,
    and sampling with --scaffold gives the single process's file."""
    csv = tmp_path / "s.csv"
    mols = open(data).read().split()
    rings = ["c1ccccc1", "", "C1CCNCC1", "c1ccncc1"]  # "" = no prefix for that row
    csv.write_text("smiles,scaffold\n" + "".join("%s,%s\n" % (m, rings[i % 4])
                                                 for i, m in enumerate(mols)))
    args = ["train", "--data", str(csv), "--scaffold-column", "scaffold", "--steps", "100",
            "--val-every", "50"] + TINY
    one, many = str(tmp_path / "one"), str(tmp_path / "many")
    ok(alone(args + ["--out", one + ".st", "--loss-log", one + ".log"]))
    ok(mpirun(3, args + ["--out", many + ".st", "--loss-log", many + ".log"]))
    same_training(one + ".log", many + ".log", 100)
    same_params(one + ".st", many + ".st")
    ref, out = str(tmp_path / "one.smi"), str(tmp_path / "many.smi")
    common = ["sample", "--model", one + ".st", "-n", "37", "--seed", "2", "--threads", "1",
              "--scaffold", "c1ccncc1"]
    ok(alone(common + ["--out", ref]))
    ok(mpirun(3, common + ["--batch", "8", "--out", out]))
    assert open(ref, "rb").read() == open(out, "rb").read()


def test_resume(data, tmp_path):
    """Stopped at step 40 and resumed: with the same 2 ranks bit for bit the
    uninterrupted 2-rank run; with 1 process the same batches from step 41
    on, the losses within the summation-order bound."""
    args = ["train", "--data", data, "--steps", "80", "--val-every", "0"] + TINY
    full, part = str(tmp_path / "full"), str(tmp_path / "part")
    ok(mpirun(2, args + ["--out", full + ".st", "--loss-log", full + ".log"]))
    ok(mpirun(2, args + ["--out", part + ".st", "--stop-after", "40", "--loss-log", part + ".log"]))
    shutil.copy(part + ".st", part + "_1.st")
    shutil.copy(part + ".log", part + "_1.log")
    ok(mpirun(2, ["train", "--resume", part + ".st", "--no-progress", "--quiet", "--threads", "1",
                  "--loss-log", part + ".log"]))
    assert open(full + ".log").read() == open(part + ".log").read()
    pa, pb = params(full + ".st"), params(part + ".st")
    assert all(np.array_equal(pa[k], pb[k]) for k in pa), "not bit for bit"
    # the same checkpoint resumed by one process
    ok(alone(["train", "--resume", part + "_1.st", "--no-progress", "--quiet", "--threads", "1",
              "--loss-log", part + "_1.log"]))
    same_training(full + ".log", part + "_1.log", 80)
    same_params(full + ".st", part + "_1.st")


@pytest.fixture(scope="module")
def model(data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("model") / "m.st")
    ok(alone(["train", "--data", data, "--steps", "60", "--val-every", "0", "--out", out] + TINY))
    return out


@pytest.mark.parametrize("ranks,n,batch,more", [(2, 203, 64, []), (3, 203, 7, []), (3, 2, 64, []),
                                                (3, 101, 16, ["--constrain", "valence"])])
def test_sample_same_file(model, tmp_path, ranks, n, batch, more):
    """The molecules split by index (3 ranks: uneven; 2 molecules: a rank
    with none; constrained sampling too) make the single process's file,
    byte for byte."""
    ref, out = str(tmp_path / "one.smi"), str(tmp_path / "many.smi")
    common = ["sample", "--model", model, "-n", str(n), "--seed", "11", "--threads", "1"] + more
    ok(subprocess.run([molgen_binary()] + common + ["--out", ref], capture_output=True,
                      text=True, timeout=120, env=ENV))
    p = ok(subprocess.run(MPI + ["-np", str(ranks), molgen_binary()] + common
                          + ["--batch", str(batch), "--out", out], capture_output=True,
                          text=True, timeout=120, env=ENV))
    assert open(ref, "rb").read() == open(out, "rb").read()
    assert len(open(out).read().splitlines()) == n
    assert p.stdout.strip() == out  # rank 0 alone prints


def test_conditional_sample_same_file(data, tmp_path):
    """A conditional model sampled with --condition and --guidance (every
    row decoded twice) at 3 ranks: the single process's file, byte for
    byte; a refused condition is said once."""
    csv = tmp_path / "c.csv"
    mols = open(data).read().split()
    csv.write_text("smiles,n\n" + "".join("%s,%d\n" % (m, len(m)) for m in mols))
    model = str(tmp_path / "c.st")
    ok(alone(["train", "--data", str(csv), "--condition", "n", "--steps", "40", "--val-every",
              "0", "--out", model] + TINY))
    ref, out = str(tmp_path / "one.smi"), str(tmp_path / "many.smi")
    common = ["sample", "--model", model, "-n", "61", "--seed", "3", "--threads", "1",
              "--condition", "n=40", "--guidance", "2"]
    ok(alone(common + ["--out", ref]))
    ok(mpirun(3, common + ["--batch", "8", "--out", out]))
    assert open(ref, "rb").read() == open(out, "rb").read()
    p = mpirun(3, ["sample", "--model", model, "-n", "5", "--condition", "x=1", "--out", out])
    assert p.returncode != 0
    assert p.stderr.count("not trained on a condition 'x'") == 1, p.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_score_same_file(model, data, tmp_path, ranks):
    """The input split over the ranks (3: uneven), the rows in input order:
    the single process's CSV byte for byte, bad rows included."""
    smi = tmp_path / "in.smi"
    lines = open(data).read().splitlines()[:200]
    smi.write_text("\n".join(lines[:50] + ["C[Xe]", "", "not a smiles!"] + lines[50:]) + "\n")
    ref, out = str(tmp_path / "one.csv"), str(tmp_path / "many.csv")
    common = ["score", "--model", model, "--smiles", str(smi), "--threads", "1"]
    ok(alone(common + ["--out", ref]))
    p = ok(mpirun(ranks, common + ["--out", out]))
    assert open(ref, "rb").read() == open(out, "rb").read()
    assert len(open(out).read().splitlines()) == 1 + 203
    assert p.stderr.count("scored 203 molecules") == 1  # rank 0's summary alone
    # stdin reaches rank 0 only: refused
    p = mpirun(ranks, ["score", "--model", model, "--smiles", "-"], input="CCO\n")
    assert p.returncode == 2 and len(molgen_lines(p.stderr, "score")) == 1


def test_other_commands_refuse(model):
    p = subprocess.run(MPI + ["-np", "2", molgen_binary(), "attention", "--model", model,
                              "--smiles", "CCO", "--out", "/tmp/never.txt"],
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode != 0
    assert len(molgen_lines(p.stderr, "attention")) == 1
    assert "does not run as several MPI ranks" in p.stderr


def test_bad_data_on_one_rank(data, tmp_path):
    """Rank 1 reads another file (MPMD), or none: one message, exit 1."""
    other = tmp_path / "other.smi"
    lines = open(data).read().splitlines()
    other.write_text("\n".join(lines[:-1] + ["CCO"]) + "\n")
    out = str(tmp_path / "o.st")
    args = ["train", "--steps", "5", "--out", out] + TINY
    for rank1_data, says in [(str(other), "the 2 ranks hold different data"),
                             (str(tmp_path / "missing.smi"), "rank 1 of 2:")]:
        p = subprocess.run(MPI + ["-np", "1", molgen_binary()] + args + ["--data", data, ":",
                                  "-np", "1", molgen_binary()] + args + ["--data", rank1_data],
                           capture_output=True, text=True, timeout=60, env=ENV)
        assert p.returncode != 0
        mine = molgen_lines(p.stderr, "train")
        assert len(mine) == 1 and says in mine[0], p.stderr
        assert not os.path.exists(out)


def test_rank0_only_output_fails(data, tmp_path):
    """A file only rank 0 writes (--debug-dump-rows) cannot be opened: every
    rank stops with one message (it hung in the all-reduce once)."""
    out = str(tmp_path / "o.st")
    p = mpirun(2, ["train", "--data", data, "--steps", "3", "--out", out,
                   "--debug-dump-rows", str(tmp_path / "no" / "dir" / "rows.txt")] + TINY,
               timeout=60)
    assert p.returncode != 0
    mine = molgen_lines(p.stderr, "train")
    assert len(mine) == 1 and "rank 0 of 2" in mine[0], p.stderr


def test_full_disk_on_rank0(data, tmp_path):
    """Rank 0 cannot write the checkpoint (its file-size limit, set for
    rank 0 alone): every rank stops, one message, the previous checkpoint
    intact."""
    out = str(tmp_path / "c.st")
    ok(alone(["train", "--data", data, "--steps", "10", "--out", out] + TINY))
    before = open(out, "rb").read()
    limit = ["bash", "-c", "ulimit -f 8; exec \"$0\" \"$@\"", molgen_binary()]
    args = ["train", "--resume", out, "--steps", "20", "--no-progress", "--threads", "1"]
    p = subprocess.run(MPI + ["-np", "1"] + limit + args + [":", "-np", "1", molgen_binary()]
                       + args, capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode != 0
    mine = molgen_lines(p.stderr, "train")
    assert len(mine) == 1 and "rank 0 of 2" in mine[0], p.stderr
    assert open(out, "rb").read() == before
    assert not [f for f in os.listdir(tmp_path) if ".tmp." in f]


def test_kill_one_rank(data, tmp_path):
    """kill -9 of rank 1 mid-run: the job ends (no hang), non-zero, the last
    periodic checkpoint loads."""
    out, log = str(tmp_path / "k.st"), str(tmp_path / "k.log")
    args = ["train", "--data", data, "--steps", "1000000", "--ckpt-every", "20",
            "--val-every", "0", "--out", out, "--loss-log", log] + TINY[:-2]
    p = subprocess.Popen(MPI + ["-np", "2", molgen_binary()] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        t0 = time.time()
        while time.time() - t0 < 60 and not (os.path.exists(out) and os.path.exists(log)
                                             and len(open(log).read().splitlines()) > 30):
            time.sleep(0.2)
        assert os.path.exists(out), "no checkpoint after 60 s"
        rank1 = None
        for pid in os.listdir("/proc"):
            try:
                env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
                cmd = open("/proc/%s/cmdline" % pid, "rb").read()
            except OSError:
                continue
            if out.encode() in cmd and b"OMPI_COMM_WORLD_RANK=1" in env:
                rank1 = int(pid)
        assert rank1, "rank 1 not found"
        os.kill(rank1, signal.SIGKILL)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0
    assert re.search(r"signal 9|Killed", err), err
    ok(alone(["sample", "--model", out, "-n", "3", "--out", str(tmp_path / "s.smi")]))


def mpmd(rank0, rank1, timeout=60):
    """mpirun's MPMD form: rank 0 runs molgen rank0, rank 1 molgen rank1."""
    return subprocess.run(MPI + ["-np", "1", molgen_binary()] + rank0 + [":", "-np", "1",
                          molgen_binary()] + rank1, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def one_disagreement(p, cmd, what, rank=1):
    assert p.returncode == 1, (p.returncode, p.stderr)
    mine = molgen_lines(p.stderr, cmd)
    assert mine == ["molgen %s: rank %d of 2: the ranks disagree: %s differs from rank 0's"
                    % (cmd, rank, what)], p.stderr


def test_score_ranks_disagree_refused(model, data, tmp_path):
    """Rank 1 scores another file (or with another model,
    or with --raw-weights): one message naming it, exit 1, nothing written
    (it wrote misaligned rows with exit 0)."""
    a, b = tmp_path / "a.smi", tmp_path / "b.smi"
    lines = open(data).read().splitlines()
    a.write_text("\n".join(lines[:40]) + "\n")
    b.write_text("\n".join(lines[1:41]) + "\n")
    other = str(tmp_path / "other.st")
    ok(alone(["train", "--data", data, "--steps", "5", "--val-every", "0", "--out", other]
             + TINY))
    out = str(tmp_path / "o.csv")
    common = ["score", "--threads", "1", "--out", out]
    for r1, what in [(["--model", model, "--smiles", str(b)], "the --smiles file (its records)"),
                     (["--model", other, "--smiles", str(a)], "the --model file (its weights)"),
                     (["--model", model, "--smiles", str(a), "--raw-weights"], "--raw-weights")]:
        p = mpmd(common + ["--model", model, "--smiles", str(a)], common + r1)
        one_disagreement(p, "score", what)
        assert not os.path.exists(out)
    # a copy of the same file under another name is the same input
    shutil.copy(str(a), str(tmp_path / "copy.smi"))
    ok(mpmd(common + ["--model", model, "--smiles", str(a)],
            common + ["--model", model, "--smiles", str(tmp_path / "copy.smi")]))
    ref = str(tmp_path / "ref.csv")
    ok(alone(["score", "--model", model, "--smiles", str(a), "--threads", "1", "--out", ref]))
    assert open(ref, "rb").read() == open(out, "rb").read()


def test_sample_ranks_disagree_refused(model, tmp_path):
    """Rank 1 samples with another --seed (or -n, --temperature): one
    message naming the option, exit 1, no file (it wrote a mix of two
    seeds' molecules with exit 0 and rank 0's seed in the sidecar)."""
    out = str(tmp_path / "s.smi")
    common = ["sample", "--model", model, "--threads", "1", "--out", out]
    for r1, what in [(["--seed", "2"], "--seed"), (["-n", "11"], "-n"),
                     (["--temperature", "0.5"], "--temperature")]:
        p = mpmd(common + ["-n", "10", "--seed", "1"], common + ["-n", "10", "--seed", "1"] + r1)
        one_disagreement(p, "sample", what)
        assert not os.path.exists(out) and not os.path.exists(out + ".json")
    # three ranks: the lowest that differs says so
    p = subprocess.run(MPI + ["-np", "2", molgen_binary()] + common + [":", "-np", "1",
                       molgen_binary()] + common + ["--top-k", "3"], capture_output=True,
                       text=True, timeout=60, env=ENV)
    assert p.returncode == 1
    assert molgen_lines(p.stderr, "sample") == [
        "molgen sample: rank 2 of 3: the ranks disagree: --top-k differs from rank 0's"], p.stderr


def test_train_ranks_disagree_refused(data, tmp_path):
    """--ema (or --lr, --seed) per rank: one molgen message naming it, exit 1
    (--ema ended in MPI_ERR_TRUNCATE with no molgen message)."""
    out = str(tmp_path / "t.st")
    args = ["train", "--data", data, "--steps", "5", "--out", out] + TINY
    for r1, what in [(["--ema", "0.99"], "--ema"), (["--lr", "1e-3"], "--lr"),
                     (["--seed", "4"], "--seed")]:
        p = mpmd(args + ["--ema", "0.9"] if r1[0] == "--ema" else args,
                 args + r1)
        one_disagreement(p, "train", what)
        assert "MPI_ERR" not in p.stderr
        assert not os.path.exists(out)
    # what each machine decides alone may differ: --threads, --quiet
    ok(mpmd(args + ["--threads", "2"], [a for a in args if a != "--quiet"]))


def test_usage_error_said_once_refused(model):
    """A bad option under mpirun -np 3: one message, not one per rank; so
    is --help printed once."""
    for args, says in [(["sample", "--model", model, "--bogus"], "unknown option '--bogus'"),
                       (["score", "--model", model, "--smiles", "x.smi", "--batch", "0"],
                        "bad value '0' for --batch"),
                       (["train", "--steps", "x"], "bad value 'x' for --steps"),
                       (["sample", "--model", model, "--scaffold", "c1cc"], "not a complete")]:
        p = mpirun(3, args, timeout=60)
        assert p.returncode == 2, p.stderr
        mine = molgen_lines(p.stderr, args[0])
        assert len(mine) == 1 and says in mine[0], p.stderr
    p = ok(mpirun(3, ["score", "--help"], timeout=60))
    assert p.stdout.count("usage: molgen score") == 1, p.stdout


# ---------------------------------------------------------------- optimize
# `molgen optimize` at 2 ranks against one process: the
# shipped prior, budget 200, batch 16, a scorer written here (the share of
# nitrogen atoms, RDKit; !randomize seeded, as molgen.scoring's); each
# rank's scorer logs the molecules it was sent to LOG.<rank> and exits 3 at
# its AT-th molecule on rank FAULT_RANK. --augmented-memory 1 and
# --replay-loops 2: their rows are split over the ranks too.
OPT_PRIOR = os.path.join(REPO, "models", "molgen-moses.safetensors")
OPT_SCORER = r'''
import os, sys
from rdkit import Chem, RDLogger
RDLogger.DisableLog("rdApp.*")
rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
fail_at = int(os.environ.get("AT", "0")) if os.environ.get("FAULT_RANK") == rank else 0
log = open(os.environ["LOG"] + "." + rank, "a") if os.environ.get("LOG") else None
n = 0
for line in sys.stdin:
    s = line.rstrip("\n")
    if s.startswith("!randomize"):
        _, seed, k, smi = s.split("\t")
        m = Chem.MolFromSmiles(smi)
        print("\t".join(Chem.MolToRandomSmilesVect(m, int(k), randomSeed=int(seed) % 2147483647
                                                    + 1) if m else []), flush=True)
        continue
    n += 1
    if n == fail_at:
        sys.exit(3)
    if log: log.write(s + "\n"); log.flush()
    m = Chem.MolFromSmiles(s)
    if m is None or m.GetNumAtoms() == 0:
        print("nan", flush=True); continue
    nn = sum(a.GetSymbol() == "N" for a in m.GetAtoms())
    print("%.6f\tcanonical=%s\tn_atoms=%d" % (nn / m.GetNumAtoms(), Chem.MolToSmiles(m),
                                              m.GetNumAtoms()), flush=True)
'''
# A row's NLL at 2 ranks comes from a forward over another set of rows
# (another height and padded width of the products): fp32 rounding, measured
# 2.5e-6 relative at most.
OPT_NLL_RTOL = 1e-5


def opt_args(scorer, out, *more):
    return (["optimize", "--prior", OPT_PRIOR, "--scorer", scorer, "--budget", "200", "--batch",
             "16", "--seed", "5", "--augmented-memory", "1", "--replay-loops", "2", "--threads", "1",
             "--out", str(out)] + [str(m) for m in more])


def opt_rows(out):
    import csv
    return list(csv.DictReader(open(os.path.join(str(out), "scored.csv"))))


KEY = ("call", "step", "smiles", "canonical", "score", "scaffold", "components")


def same_scored(a, b):
    """Row by row the same molecules, scores, calls and steps; the NLLs to
    fp32 rounding."""
    ra, rb = opt_rows(a), opt_rows(b)
    assert [[r[k] for k in KEY] for r in ra] == [[r[k] for k in KEY] for r in rb]
    for x, y in zip(ra, rb):
        for k in ("prior_nll", "agent_nll"):
            assert abs(float(x[k]) - float(y[k])) <= OPT_NLL_RTOL * float(x[k]), (k, x, y)
    assert open(os.path.join(str(a), "best.smi")).read() == open(os.path.join(str(b), "best.smi")).read()


@pytest.fixture(scope="module")
def opt_runs(tmp_path_factory):
    """The scorer, one process's run and a 2-rank run of the same options."""
    rdchem = pytest.importorskip("rdkit.Chem")
    d = tmp_path_factory.mktemp("optimize")
    (d / "nfrac.py").write_text(OPT_SCORER)
    scorer = "/usr/bin/python3 %s" % (d / "nfrac.py")
    one, two = d / "one", d / "two"
    p1 = subprocess.run([molgen_binary()] + opt_args(scorer, one), capture_output=True, text=True,
                        timeout=300, env=dict(ENV, LOG=str(d / "one.log")))
    p2 = subprocess.run(MPI + ["-np", "2", molgen_binary()] + opt_args(scorer, two),
                        capture_output=True, text=True, timeout=300,
                        env=dict(ENV, LOG=str(d / "two.log")))
    return dict(dir=d, scorer=scorer, one=one, two=two, p1=ok(p1), p2=ok(p2), Chem=rdchem)


def test_optimize_split_scores_like_one_process(opt_runs):
    """2 ranks: the batch sampled and scored split over the ranks' scorers,
    the same scored.csv as one process (molecules, scores, calls, steps in
    order; NLLs to fp32 rounding), the scores RDKit's, the agent the one
    process's to rounding, and rank 0 alone prints."""
    r = opt_runs
    same_scored(r["one"], r["two"])
    rows = opt_rows(r["two"])
    assert [int(x["call"]) for x in rows] == list(range(1, 201))
    Chem = r["Chem"]
    for x in rows:  # the oracle: RDKit's share of N atoms
        m = Chem.MolFromSmiles(x["smiles"])
        want = sum(a.GetSymbol() == "N" for a in m.GetAtoms()) / m.GetNumAtoms()
        assert float(x["score"]) == pytest.approx(want, abs=5e-7)
        assert x["canonical"] == Chem.MolToSmiles(m)
    # the scoring was split: both ranks' scorers were sent molecules, together
    # exactly what the one process's scorer was sent
    sent = [open(str(r["dir"] / ("two.log.%d" % k))).read().split() for k in (0, 1)]
    assert sent[0] and sent[1]
    assert sorted(sent[0] + sent[1]) == sorted(open(str(r["dir"] / "one.log.0")).read().split())
    s1 = json.load(open(str(r["one"] / "summary.json")))
    s2 = json.load(open(str(r["two"] / "summary.json")))
    for k in ("calls", "steps", "stop", "top1", "top10", "top100", "auc_top10"):
        assert s1[k] == s2[k], k
    # the agents moved alike from the prior: their difference is under 1% of
    # the movement (measured 4e-4), the key bias excepted (see LOSS_RTOL)
    a, b, p = params(str(r["one"] / "agent.safetensors")), \
        params(str(r["two"] / "agent.safetensors")), params(OPT_PRIOR)
    num = den = 0.0
    for k in p:
        x, y, q = (np.asarray(t[k], np.float64).ravel() for t in (a, b, p))
        if k.endswith("in_proj_bias"):
            d = len(x) // 3
            x, y, q = (np.r_[v[:d], v[2 * d:]] for v in (x, y, q))
        num += ((x - y) ** 2).sum()
        den += ((x - q) ** 2).sum()
    assert den > 0 and (num / den) ** 0.5 < 1e-2
    steps = [l for l in r["p2"].stderr.splitlines() if l.startswith("step ")]
    assert len(steps) == s2["steps"]
    assert len(molgen_lines(r["p2"].stderr, "optimize")) == 1
    assert r["p2"].stdout.strip() == str(r["two"])


def test_optimize_scorer_fault_on_rank1(opt_runs, tmp_path):
    """Rank 1's scorer exits at its 40th molecule: one message (rank 1's),
    exit 1, the state saved by rank 0; --resume at 2 ranks gives the straight
    2-rank run's files byte for byte, and alone the same molecules."""
    r = opt_runs
    out = tmp_path / "f"
    p = subprocess.run(MPI + ["-np", "2", molgen_binary()] + opt_args(r["scorer"], out),
                       capture_output=True, text=True, timeout=300,
                       env=dict(ENV, FAULT_RANK="1", AT="40"))
    assert p.returncode == 1, p.stderr
    # two processes' stderr: in either order
    lines = sorted(molgen_lines(p.stderr, "optimize"), key=lambda l: "the state" in l)
    assert len(lines) == 2, p.stderr
    assert re.fullmatch(r"molgen optimize: rank 1 of 2: the scorer exited with status 3 before "
                        r"answering molecule \d+ of the batch '[^']+'", lines[0]), lines
    m = re.fullmatch(r"molgen optimize: the state of step (\d+)'s start is saved in (\S+): "
                     r"continue with --resume (\S+)", lines[1])
    assert m and m.group(2) == str(out / "agent.safetensors") and m.group(3) == str(out), lines
    done = opt_rows(out)
    assert 0 < len(done) < 200 and all(int(x["step"]) < int(m.group(1)) - 1 for x in done[-1:])
    shutil.copytree(str(out), str(tmp_path / "g"))
    resume = ["--resume", str(out)]
    args = [a for a in opt_args(r["scorer"], out) if a not in ("--out", str(out))]
    ok(subprocess.run(MPI + ["-np", "2", molgen_binary()] + args + resume, capture_output=True,
                      text=True, timeout=300, env=ENV))
    for f in ("scored.csv", "best.smi", "agent.safetensors"):
        assert open(str(out / f), "rb").read() == open(str(r["two"] / f), "rb").read(), f
    # another number of ranks (here one process) continues the same run
    g = tmp_path / "g"
    ok(alone([a for a in opt_args(r["scorer"], g) if a not in ("--out", str(g))]
             + ["--resume", str(g)], timeout=300))
    same_scored(g, r["two"])


def test_optimize_ranks_disagree_refused(opt_runs, tmp_path):
    """Rank 1 with another --seed (or another scorer command): one message
    naming it, exit 1, no DIR."""
    r = opt_runs
    out = tmp_path / "o"
    base = opt_args(r["scorer"], out)
    for r1, what in [(["--seed", "6"], "--seed"), (["--scorer", r["scorer"] + " "], "--scorer")]:
        p = mpmd(base, base + r1)
        one_disagreement(p, "optimize", what)
        assert not os.path.exists(str(out))
