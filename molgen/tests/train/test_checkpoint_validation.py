"""Checkpoints and models whose numbers are not valid, tried
through the molgen binary ($MOLGEN_BIN, else <dir of
$ATTN_LIBRARY>/molgen/molgen, else build/molgen/molgen):

3. a checkpoint whose optimizer moments or average hold NaN / Inf or a
   negative second moment (the tensor's CRC-32 recomputed so that it passes,
   as the writer computes it) is refused by --resume naming the tensor, with
   the file left byte for byte, and by every other load path (sample, score,
   attention, train --init, with and without --raw-weights); a run whose
   training loss turns non-finite stops with a clear error and writes nothing.
7. a conditional model whose "condition" normalisation is tampered with
   (std 1e-320, mean 1e308, std 0 or < 0, NaN, Inf, unordered percentiles,
   names sampling cannot give as name=value) is refused at load naming the
   condition and the field; train --condition refuses such names.

The writer's refusal (mg_ckpt_save, mg_model_save) is test_checkpoint.c's."""
import glob
import hashlib
import json
import math
import os
import shutil
import struct
import zlib

import pytest

from molgen_bin import TINY, run_molgen, write_molecules  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
COND_MODEL = os.path.join(REPO, "models", "molgen-moses-cond.safetensors")
NAN, INF = float("nan"), float("inf")


def run(args, timeout=120):
    return run_molgen(args, ok=False, timeout=timeout)


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def error_line(p):
    """exit 1 and one line on stderr: the line."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr)
    return lines[0]


# ---- the file format, written independently of molgen (safetensors.h)

def read_st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])


def write_st(path, hdr, buf):
    """The header (padded with spaces to a multiple of 8) and the buffer."""
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(buf))


def floats(hdr, buf, name):
    b, e = hdr[name]["data_offsets"]
    return struct.unpack("<%df" % ((e - b) // 4), bytes(buf[b:e]))


def with_value(src, dst, name, index, value):
    """src with element `index` of F32 tensor `name` set to value and that
    tensor's CRC-32 (zlib's, over its bytes) updated in the checksum table."""
    hdr, buf = read_st(src)
    b, e = hdr[name]["data_offsets"]
    buf[b + 4 * index:b + 4 * index + 4] = struct.pack("<f", value)
    table = json.loads(hdr["__metadata__"]["crc32"])
    table[name] = "%08x" % zlib.crc32(bytes(buf[b:e]))
    hdr["__metadata__"]["crc32"] = json.dumps(table)
    write_st(dst, hdr, buf)


@pytest.fixture(scope="module")
def smiles(tmp_path_factory):
    return write_molecules(tmp_path_factory.mktemp("data"), 300)[0]


@pytest.fixture(scope="module")
def ckpt(smiles, tmp_path_factory):
    """A tiny resumable checkpoint with an average (4 of 4 steps, --ema)."""
    path = str(tmp_path_factory.mktemp("ckpt") / "ck.safetensors")
    p = run(["train", "--data", smiles, "--steps", "4", "--ema", "0.9", "--out", path] + TINY)
    assert p.returncode == 0, p.stderr
    hdr, buf = read_st(path)
    # the oracle of the cases below: every value valid before the mutation
    for name in hdr:
        if name != "__metadata__":
            assert all(math.isfinite(x) for x in floats(hdr, buf, name)), name
    assert min(floats(hdr, buf, "optim.v")) >= 0
    return path


def fmt(x):
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else "%g" % x


STATE = [("optim.v", 17, -0.5), ("optim.v", 2, NAN), ("optim.m", 3, INF), ("optim.m", 0, -INF),
         ("ema", 3, NAN), ("ema", 9, INF), ("blocks.0.ln1.weight", 4, NAN)]


def expected(name, index, value):
    if value < 0 and not math.isinf(value):
        return ("tensor '%s' holds a negative value (%s at element %d): a second moment must be "
                ">= 0" % (name, fmt(value), index))
    return "tensor '%s' holds a non-finite value (%s at element %d)" % (name, fmt(value), index)


@pytest.mark.parametrize("name,index,value", STATE)
def test_resume_refuses_and_keeps_the_file(ckpt, tmp_path, name, index, value):
    bad = str(tmp_path / "bad.safetensors")
    with_value(ckpt, bad, name, index, value)
    before = digest(bad)
    line = error_line(run(["train", "--resume", bad, "--steps", "6", "--out", bad]))
    assert "checkpoint %s: %s" % (bad, expected(name, index, value)) in line, line
    assert digest(bad) == before
    assert os.listdir(str(tmp_path)) == ["bad.safetensors"]  # no temporary left


@pytest.mark.parametrize("name,index,value", STATE)
def test_every_load_path_refuses(ckpt, smiles, tmp_path, name, index, value):
    bad = str(tmp_path / "bad.safetensors")
    with_value(ckpt, bad, name, index, value)
    want = "%s: %s" % (bad, expected(name, index, value))
    for i, args in enumerate((["sample", "-n", "2"], ["sample", "-n", "2", "--raw-weights"],
                              ["score", "--smiles", smiles],
                              ["score", "--smiles", smiles, "--raw-weights"],
                              ["attention", "--smiles", "CCO"])):
        out = str(tmp_path / ("out%d" % i))
        line = error_line(run(args + ["--model", bad, "--out", out]))
        assert want in line, (args, line)
        # attention makes its output directory before it loads (empty here)
        assert not os.path.exists(out) or os.listdir(out) == [], args
    out = str(tmp_path / "init.safetensors")
    line = error_line(run(["train", "--init", bad, "--data", smiles, "--steps", "2", "--out", out]
                          + TINY[6:]))
    assert "--init: " + want in line, line
    assert not os.path.exists(out)


def test_valid_extremes_still_load(ckpt, tmp_path):
    """A zero (or -0) second moment is what a never-updated parameter has."""
    ok = str(tmp_path / "ok.safetensors")
    with_value(ckpt, ok, "optim.v", 5, 0.0)
    with_value(ok, ok, "optim.v", 6, -0.0)
    p = run(["train", "--resume", ok, "--steps", "5", "--out", ok])
    assert p.returncode == 0, p.stderr


def test_non_finite_loss_stops_and_writes_nothing(ckpt, tmp_path):
    """Finite but absurd output biases (every real token's logit -3e38, PAD's
    3e38: each target's log-probability is -6e38, -inf in float): the loss is
    inf, the run stops at its first step and the checkpoint is left as it
    was (old molgen trained on, printed "train loss inf" and overwrote it)."""
    bad = str(tmp_path / "huge.safetensors")
    shutil.copy(ckpt, bad)
    hdr, _ = read_st(bad)
    V = hdr["head.bias"]["shape"][0]
    for k in range(V):
        with_value(bad, bad, "head.bias", k, 3e38 if k == 0 else -3e38)
    before = digest(bad)
    line = error_line(run(["train", "--resume", bad, "--steps", "8", "--out", bad, "--quiet"]))
    assert "step 4: the training loss is inf: the run diverged" in line, line
    assert "%s is left as it was" % bad in line, line
    assert digest(bad) == before
    assert glob.glob(bad + ".tmp.*") == []


# ---- 7. condition normalisation

def cond_mutant(dst, field, k, value):
    """models/molgen-moses-cond.safetensors with condition metadata
    field[k] = value (written by Python's json: NaN / Infinity for those)."""
    hdr, buf = read_st(COND_MODEL)
    meta = json.loads(hdr["__metadata__"]["condition"])
    meta[field][k] = value
    hdr["__metadata__"]["condition"] = json.dumps(meta)
    write_st(dst, hdr, buf)
    return meta["names"][k] if field != "names" else value


COND = [("std", 0, 1e-320, 'too small for "mean"'),
        ("mean", 0, 1e308, "beyond the float range"),
        ("std", 1, 0.0, '"std" 0 must be > 0'),
        ("std", 2, -1.0, '"std" -1 must be > 0'),
        ("std", 3, NAN, '"std" is not a finite number'),
        ("mean", 1, NAN, '"mean" is not a finite number'),
        ("max", 2, INF, '"max" is not a finite number'),
        ("min", 3, -INF, '"min" is not a finite number'),
        ("min", 0, -1e39, "beyond the float range"),
        ("p01", 1, 0.99, "are not in increasing order"),
        ("p99", 2, 1.0, "are not in increasing order")]


@pytest.fixture(scope="module")
def cond_names():
    hdr, _ = read_st(COND_MODEL)
    return json.loads(hdr["__metadata__"]["condition"])["names"]


@pytest.mark.parametrize("field,k,value,msg", COND)
def test_tampered_normalisation_refused_at_load(tmp_path, cond_names, field, k, value, msg):
    bad = str(tmp_path / "c.safetensors")
    cond_mutant(bad, field, k, value)
    out = str(tmp_path / "s.smi")
    smi = tmp_path / "in.smi"
    smi.write_text("CCO\nc1ccccc1\n")
    for args in (["sample", "--model", bad, "-n", "2", "--out", out],
                 ["sample", "--model", bad, "-n", "2", "--condition", "logp=2", "--out", out],
                 ["score", "--model", bad, "--smiles", str(smi), "--out", out]):
        line = error_line(run(args))
        assert "%s: condition metadata: '%s': " % (bad, cond_names[k]) in line, (args, line)
        assert '"%s"' % field in line and msg in line, (args, line)
        assert not os.path.exists(out)


@pytest.mark.parametrize("name,why", [("q=e", "contains '='"), ("a,b", "contains ','"),
                                      ("", "is empty"), (" qed", "starts or ends with a space"),
                                      ("q\ted", "contains a tab")])
def test_unusable_condition_name_refused_at_load(tmp_path, name, why):
    bad = str(tmp_path / "c.safetensors")
    cond_mutant(bad, "names", 1, name)
    line = error_line(run(["sample", "--model", bad, "-n", "2", "--out",
                           str(tmp_path / "s.smi")]))
    assert "condition metadata: name 1 '%s' %s" % (name, why) in line, line


def test_shipped_conditional_model_loads(tmp_path):
    p = run(["sample", "--model", COND_MODEL, "-n", "2", "--condition", "logp=2", "--out",
             str(tmp_path / "s.smi")])
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def cond_csv(tmp_path_factory):
    """60 molecules with columns that --condition cannot or can name."""
    mols = [l.split()[0] for l in open(os.path.join(REPO, "data", "moses_20k.smi"))][:60]
    path = str(tmp_path_factory.mktemp("csv") / "c.csv")
    with open(path, "w") as f:
        f.write("smiles,a=b,c\td,c d\n")
        for i, s in enumerate(mols):
            f.write("%s,%g,%g,%g\n" % (s, i % 7, i % 5, i % 3))
    return path


@pytest.mark.parametrize("name,why", [("a=b", "contains '='"), ("c\td", "contains a tab")])
def test_train_refuses_unusable_condition_names(cond_csv, tmp_path, name, why):
    out = str(tmp_path / "t.safetensors")
    line = error_line(run(["train", "--data", cond_csv, "--condition", name, "--steps", "2",
                           "--out", out, "--quiet"] + TINY))
    assert "condition name '%s' %s" % (name, why) in line, line
    assert "--condition name=value" in line
    assert not os.path.exists(out)


def test_inner_space_name_trains_and_samples(cond_csv, tmp_path):
    """A space inside a name is fine: the request syntax trims only around it."""
    out = str(tmp_path / "t.safetensors")
    p = run(["train", "--data", cond_csv, "--condition", "c d", "--steps", "2", "--out", out]
            + TINY)
    assert p.returncode == 0, p.stderr
    p = run(["sample", "--model", out, "-n", "2", "--condition", "c d=1", "--out",
             str(tmp_path / "s.smi")])
    assert p.returncode == 0, p.stderr
