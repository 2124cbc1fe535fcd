"""molgen sample --constrain (issue 15): the mask checked by independent
oracles through the binary.

- RDKit: with --constrain syntax every molecule that ended (EOS before
  ctx_len) parses (Chem.MolFromSmiles, sanitize off); with valence none has
  a valence error (SanitizeMol's "Explicit valence ... greater than
  permitted"), on a small quickly trained model whose unconstrained samples
  mostly fail both.
- with valence the shipped model's molecules pass RDKit at >= 0.978 (0.966
  before the Kekulé check: nearly all of its failures were kekulisation).
- --constrain none (and no option) is bitwise the sampler before the option
  existed: the digest of the shipped model's samples recorded with the
  binary of commit bdb073f.
- The sidecar OUT.json names the mode; a bad mode is a usage error.
Run with /usr/bin/python3 -m pytest (needs RDKit)."""
import hashlib
import json
import os
import re
import subprocess

import pytest

from molgen_bin import molgen_binary  # noqa: E402

Chem = pytest.importorskip("rdkit.Chem")
from rdkit import RDLogger  # noqa: E402

RDLogger.DisableLog("rdApp.*")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DATA20K = os.path.join(REPO, "data", "moses_20k.smi")
SHIPPED = os.path.join(REPO, "models", "molgen-moses.safetensors")
# MolGPT / MOSES token regex (molgen/tokenizer.h)
TOKEN = re.compile(r"(\[[^\]]+]|<|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9])")
# `molgen sample --model models/molgen-moses.safetensors -n 300 --seed 11
# --threads 1` with the binary of commit bdb073f (before --constrain), on an
# AVX2 + FMA CPU
GOLDEN_SHA256 = "3b16cc8a3987070f67eaa871aa8031ae3ba113cdc87aa8cc52f2b3ff739fe7a0"


def run(args, timeout=600):
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OMP_WAIT_POLICY="PASSIVE")
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """1 block, width 32, 150 steps on 2000 molecules (~1 s): its
    unconstrained samples are mostly broken."""
    d = tmp_path_factory.mktemp("tiny")
    data = d / "train.smi"
    with open(DATA20K) as f:
        data.write_text("".join(next(f) for _ in range(2000)))
    model = str(d / "tiny.safetensors")
    p = run(["train", "--data", str(data), "--out", model, "--layers", "1", "--d-model", "32",
             "--heads", "2", "--batch-size", "16", "--steps", "150", "--lr", "0.003",
             "--no-progress", "--val-every", "0", "--threads", "2", "--quiet"])
    assert p.returncode == 0, p.stderr
    cfg = json.loads(read_header(model)["__metadata__"]["config"])
    return model, cfg["ctx_len"]


def read_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def sample(model, mode, out, n=3000, seed=1):
    p = run(["sample", "--model", model, "-n", str(n), "--seed", str(seed), "--threads", "2",
             "--constrain", mode, "--out", str(out)])
    assert p.returncode == 0, p.stderr
    return [l.rstrip("\n") for l in open(out)], json.loads(open(str(out) + ".json").read())


def rdkit_verdict(smi):
    """'parse', 'valence', 'other' (kekulisation, ...) or 'ok'."""
    m = Chem.MolFromSmiles(smi, sanitize=False)
    if m is None:
        return "parse"
    try:
        Chem.SanitizeMol(m)
    except Exception as e:  # RDKit raises its own exception classes
        return "valence" if "valence" in str(e).lower() else "other"
    return "ok"


def verdicts(lines, ctx):
    """Counts by RDKit verdict over the molecules that ended (fewer than ctx
    tokens), and the number that ran to ctx without EOS."""
    counts, truncated = {}, 0
    for s in lines:
        if len(TOKEN.findall(s)) >= ctx:
            truncated += 1
            continue
        v = rdkit_verdict(s)
        counts[v] = counts.get(v, 0) + 1
    return counts, truncated


def test_constrained_samples_pass_rdkit(tiny, tmp_path):
    model, ctx = tiny
    none, meta = sample(model, "none", tmp_path / "none.smi")
    assert meta["constrain"] == "none"
    c_none, _ = verdicts(none, ctx)
    # the oracle can fail: unconstrained, this model breaks most strings
    assert c_none.get("parse", 0) > len(none) // 2, c_none
    assert c_none.get("valence", 0) > 10, c_none

    syn, meta = sample(model, "syntax", tmp_path / "syntax.smi")
    assert meta["constrain"] == "syntax"
    c_syn, trunc = verdicts(syn, ctx)
    assert c_syn.get("parse", 0) == 0, c_syn
    assert trunc == meta["no_eos"] and trunc <= len(syn) // 50, (trunc, meta)

    val, meta = sample(model, "valence", tmp_path / "valence.smi")
    assert meta["constrain"] == "valence"
    c_val, trunc = verdicts(val, ctx)
    assert c_val.get("parse", 0) == 0 and c_val.get("valence", 0) == 0, c_val
    assert trunc == meta["no_eos"] and trunc <= len(val) // 50, (trunc, meta)
    print("RDKit verdicts of 3000 (ended) none %s syntax %s valence %s" % (c_none, c_syn, c_val))


def test_valence_dead_ends_restart(tiny, tmp_path):
    """When the Kekulé look-ahead leaves no token (a dead end after a prefix
    it let through), the molecule starts again instead of going on without
    the check: every molecule that ended passes the valence level's own
    whole-string check (molgen debug-check; before, the dead ends' strings
    came out, refused by it), the sidecar counts the restarts, and none fell
    back. (RDKit still refuses about 3 % of this broken model's strings:
    explicit '=' at aromatic atoms and other gaps of the check, printed.)"""
    model, ctx = tiny
    val, meta = sample(model, "valence", tmp_path / "valence.smi", seed=2)
    assert meta.get("kekule_restarts", 0) > 0 and meta.get("kekule_fallbacks") == 0, meta
    ended = [s for s in val if len(TOKEN.findall(s)) < ctx]
    p = subprocess.run([molgen_binary(), "debug-check"], input="\n".join(ended) + "\n",
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    refused = [(s, l) for s, l in zip(ended, p.stdout.splitlines()) if l.split()[2] != "1"]
    assert len(p.stdout.splitlines()) == len(ended)
    assert not refused, refused[:5]
    counts, _ = verdicts(ended, ctx)
    print("tiny model, valence, %d ended: restarts %d, RDKit %s"
          % (len(ended), meta["kekule_restarts"], counts))


def test_valence_kekulises_the_shipped_models_samples(tmp_path):
    """The Kekulé part of --constrain valence, judged by RDKit: 1,500 of the
    shipped model's molecules. Before it (aromatic atoms' valences only)
    0.966 of 3,000 passed RDKit, nearly every failure a kekulisation; with it
    0.988. The bound 0.978 is 3.5 standard errors of 1,500 above 0.966."""
    lines, meta = sample(SHIPPED, "valence", tmp_path / "v.smi", n=1500, seed=7)
    counts, trunc = verdicts(lines, 10 ** 6)
    ok = counts.get("ok", 0) / len(lines)
    print("shipped model, --constrain valence, 1500 molecules: RDKit %s" % counts)
    assert counts.get("parse", 0) <= 3 and counts.get("valence", 0) == 0, counts
    assert ok >= 0.978, counts


def test_none_is_the_sampler_before_the_option(tmp_path):
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if "avx512f" in flags or " avx2" not in flags:
        pytest.skip("the golden digest was recorded with the AVX2 kernels")
    for extra in ([], ["--constrain", "none"]):
        out = tmp_path / "s.smi"
        p = run(["sample", "--model", SHIPPED, "-n", "300", "--seed", "11", "--threads", "1",
                 "--out", str(out)] + extra)
        assert p.returncode == 0, p.stderr
        assert hashlib.sha256(out.read_bytes()).hexdigest() == GOLDEN_SHA256, extra


def test_bad_mode_is_a_usage_error(tmp_path):
    p = run(["sample", "--model", SHIPPED, "-n", "3", "--constrain", "strict",
             "--out", str(tmp_path / "s.smi")])
    assert p.returncode == 2
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "strict" in lines[0], p.stderr
    assert not (tmp_path / "s.smi").exists()
