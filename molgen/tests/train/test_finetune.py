"""molgen train --init / --freeze from the command line, with Python's own
readers as the oracles: the checkpoint's "train" metadata names the init
file and holds zlib.crc32 of its parameters (in the tensor table's order,
the PyTorch twin's named_parameters order); the frozen tensors read back
with torch_model.load_safetensors are bitwise the init's, the others
changed; lines longer than the init's context are reported as file:line,
counted in the summary and said once; tokens outside its vocabulary are
refused (test_extend_vocab.py); conflicting model options are
refused with a message that says why.

Generalising: with --init the run validates on at least 50
molecules, keeps the best scheduled validation's state (bitwise the state a
--keep last run stopped at that step holds), stops after --patience
validations without improvement, resumes a best-kept checkpoint into the
straight run's file bit for bit, and its end-of-run sample check counts the
copies that `molgen sample` with the same seed shows."""
import json
import os
import subprocess
import zlib

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(os.path.dirname(HERE))
REPO = os.path.dirname(MOLGEN_DIR)

from molgen_bin import molgen_binary  # noqa: E402

DATA = os.path.join(REPO, "data", "moses_20k.smi")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def train(args):
    return subprocess.run([molgen_binary(), "train", "--no-progress", "--threads", "2"] + args,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, check=False)


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    d = tmp_path_factory.mktemp("ft")
    with open(DATA) as f:
        lines = [next(f) for _ in range(300)]
    (d / "base.smi").write_text("".join(lines))
    path = str(d / "init.safetensors")
    p = train(["--data", str(d / "base.smi"), "--steps", "5", "--layers", "2", "--d-model", "32",
               "--heads", "2", "--batch-size", "16", "--out", path])
    assert p.returncode == 0, p.stderr
    return d, path


def test_init_metadata_freeze_and_skips(init):
    tm = pytest.importorskip("molgen.torch_model")
    d, path = init
    focused = d / "focused.smi"
    with open(DATA) as f:
        lines = [next(f) for _ in range(400)][300:]
    focused.write_text("".join(lines) + "C" * 200 + "\n")
    out = str(d / "ft.safetensors")
    p = train(["--init", path, "--data", str(focused), "--steps", "4", "--freeze", "1",
               "--lr", "1e-3", "--batch-size", "16", "--keep", "last", "--out", out])
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert "focused.smi:101: too long" in err
    # counted and said once, with the first line and the model's limit
    assert "1 molecule(s) of %s longer than the context of --init" % focused in err
    assert "first at %s:101 (200 tokens, more than the model's limit" % focused in err
    summary = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert summary["skipped_lines"] == 1 and summary["init"] == path

    before, meta0 = tm.load_safetensors(path)
    after, meta = tm.load_safetensors(out)
    names = [n for n, _ in tm.MolGPT(tm.Config.from_json(meta0["config"])).named_parameters()]
    crc = 0
    for n in names:
        crc = zlib.crc32(np.ascontiguousarray(before[n], dtype="<f4").tobytes(), crc)
    t = json.loads(meta["train"])
    assert t["init"] == path and t["init_crc32"] == "%08x" % crc and t["freeze"] == 1
    frozen = [n for n in names if n.startswith(("tok_emb", "pos_emb", "blocks.0."))]
    assert len(frozen) == 2 + 12
    for n in names:
        same = np.array_equal(before[n].view(np.uint32), after[n].view(np.uint32))
        assert same == (n in frozen), n


def test_refusals(init):
    d, path = init
    out = str(d / "x.safetensors")
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--d-model", "64", "--out", out])
    assert p.returncode == 1
    assert b"--d-model 64 conflicts with --init" in p.stderr and b"whose d_model is 32" in p.stderr
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--preset", "molgpt", "--out", out])
    assert p.returncode == 2 and b"--preset with --init" in p.stderr
    p = train(["--init", path, "--data", str(d / "base.smi"), "--steps", "2", "--freeze", "3",
               "--out", out])
    assert p.returncode == 1 and b"cannot freeze 3 blocks of a 2-block model" in p.stderr
    (d / "alien.smi").write_text("C[Se]C\nC[Te]C\n")
    p = train(["--init", path, "--data", str(d / "alien.smi"), "--steps", "2", "--out", out])
    assert p.returncode == 1 and b"2 token(s) that --init" in p.stderr
    assert b"'[Se]' (1 molecule, first at " in p.stderr and b"--extend-vocab" in p.stderr
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--condition", "logp", "--out", out])
    assert p.returncode == 1 and b"fine-tuning with --condition is not supported" in p.stderr
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--out", path])
    assert p.returncode == 1 and b"refusing to" in p.stderr
    assert not os.path.exists(out)


def focused_set(d, n=200):
    path = d / "focused200.smi"
    with open(DATA) as f:
        lines = [next(f) for _ in range(300 + n)][300:]
    path.write_text("".join(lines))
    return str(path), {ln.split()[0] for ln in lines}


def summary(p):
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


def params(path):
    tm = pytest.importorskip("molgen.torch_model")
    t, _ = tm.load_safetensors(path)
    return {k: v for k, v in t.items() if not k.startswith(("optim.", "ema"))}


def test_defaults_keep_best_and_check(init):
    d, path = init
    data, mols = focused_set(d)
    out = str(d / "best.safetensors")
    s = summary(train(["--init", path, "--data", data, "--steps", "12", "--val-every", "2",
                       "--out", out]))
    p = train(["--init", path, "--data", data, "--steps", "12", "--val-every", "2",
               "--out", str(d / "again.safetensors")])
    # 199 of the 200 lines fit the init's context: 10% (20) is below the least validation
    # split, min(50, a quarter of the data)
    assert b"1 too long" in p.stderr and b"150 train / 49 validation molecules" in p.stderr
    assert s["keep"] == "best" and s["step"] == 12
    curve = s["val_curve"]
    assert [c[0] for c in curve] == list(range(0, 13, 2))
    best = min(curve, key=lambda c: (c[1], c[0]))
    assert s["kept_step"] == best[0] and s["kept_val_loss"] == pytest.approx(best[1], abs=1e-6)
    # the kept state: bitwise what a --keep last run stopped at that step holds
    ref = str(d / "ref.safetensors")
    if s["kept_step"] > 0:
        summary(train(["--init", path, "--data", data, "--steps", "12", "--val-every", "2",
                       "--keep", "last", "--stop-after", str(s["kept_step"]), "--out", ref]))
    else:
        ref = path
    a, b = params(out), params(ref)
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k
    # the check: 500 samples, seed 1; its copies are the lines molgen sample draws that are
    # data lines as written
    c = s["check"]
    assert c["samples"] == 500
    smp = str(d / "check.smi")
    r = subprocess.run([molgen_binary(), "sample", "--model", out, "-n", "500", "--seed", "1",
                        "--out", smp], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr
    with open(smp) as f:
        drawn = [ln.strip() for ln in f]
    assert len(drawn) == 500
    assert c["copies"] == sum(x in mols for x in drawn)
    assert c["syntax_ok"] >= c["copies"] and c["distinct"] >= c["novel_distinct"]


def test_patience_stops_early(init):
    d, path = init
    data, _ = focused_set(d)
    s = summary(train(["--init", path, "--data", data, "--steps", "400", "--val-every", "2",
                       "--patience", "2", "--lr", "1e-2", "--out", str(d / "pat.safetensors")]))
    assert s["stop"] == "no_improvement", s
    curve = s["val_curve"]
    k = [c[0] for c in curve].index(s["kept_step"])
    after = curve[k + 1:]
    assert len(after) == 2 and all(c[1] >= curve[k][1] for c in after)
    assert all(c[1] > curve[k][1] for c in curve[:k])
    assert s["step"] == s["kept_step"] + 2 * 2 < 400


def test_resume_of_best_kept_is_the_straight_run(init):
    d, path = init
    data, _ = focused_set(d)
    base = ["--init", path, "--data", data, "--steps", "12", "--val-every", "3", "--lr", "1e-3"]
    straight = str(d / "straight.safetensors")
    half = str(d / "half.safetensors")
    s = summary(train(base + ["--out", straight]))
    h = summary(train(base + ["--stop-after", "7", "--out", half]))
    assert h["step"] == 7 and h["kept_step"] in (0, 3, 6)
    r = summary(subprocess.run([molgen_binary(), "train", "--resume", half, "--no-progress",
                                "--threads", "2"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=ENV))
    assert r["kept_step"] == s["kept_step"] and r["step"] == s["step"]
    tm = pytest.importorskip("molgen.torch_model")
    a, _ = tm.load_safetensors(straight)
    b, _ = tm.load_safetensors(half)
    assert a.keys() == b.keys()
    for k in a:  # parameters and AdamW moments
        assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k


def test_keep_best_needs_validation_and_patience_needs_best(init):
    d, path = init
    data, _ = focused_set(d)
    out = str(d / "x.safetensors")
    p = train(["--init", path, "--data", data, "--steps", "2", "--val-frac", "0", "--out", out])
    assert p.returncode == 1 and b"--keep best needs validation molecules" in p.stderr
    p = train(["--init", path, "--data", data, "--steps", "2", "--keep", "last", "--patience",
               "3", "--out", out])
    assert p.returncode == 1 and b"--patience 3 needs --keep best" in p.stderr
    p = train(["--init", path, "--data", data, "--steps", "2", "--keep", "worst", "--out", out])
    assert p.returncode == 1 and b"--keep worst: need best or last" in p.stderr
