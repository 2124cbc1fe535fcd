"""Conditional generation (molgen/chem/condition.h, molgen.props, molgen.metrics --condition).

1. molgen.props against RDKit called directly (Crippen, QED, the Contrib
   sascorer loaded from its file, TPSA, MolWt, GetScaffoldForMol).
2. A tiny model trained briefly on a synthetic condition that decides the
   last atom of the SMILES (O or N) obeys it when sampling (the condition
   at every position and at the BOS position only, KV and naive decoding,
   with --constrain valence too).
3. The normalisation kept in the checkpoint equals numpy's mean and sample
   std of the CSV column (a row with an empty field left out).
4. A conditional run stopped half way and resumed continues bit for bit.
5. Refusals: unknown condition names, values outside the training range,
   --condition on an unconditional model, --condition on a .smi file or an
   unknown column; the shipped unconditional model still samples.
6. molgen.metrics --condition / --scaffold against the same quantities computed
   here with RDKit.

The molgen binary: $MOLGEN_BIN, else <dir of $ATTN_LIBRARY>/molgen/molgen,
else build/molgen/molgen."""
import json
import os
import random
import struct
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("rdkit")

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(os.path.dirname(HERE))
REPO = os.path.dirname(MOLGEN_DIR)
from molgen_bin import first_molecules, run_molgen  # noqa: E402

SHIPPED = os.path.join(REPO, "models", "molgen-moses.safetensors")
ROUND_TRIP_FAILS = "Cc1#CC(=O)OC1(c2ccc3ccccc3c2)C1NC(=O)N1"
MOLS = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccc2[nH]ccc2c1", "CCO", "CN1CCC(CC1)Nc1ncc(F)cn1",
        "O=C(NCc1ccco1)c1ccc(Cl)cc1"]


run = run_molgen


def load_st(path):
    """(header dict, data bytes) of a safetensors file."""
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def tensors(path):
    h, d = load_st(path)
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()
            if k != "__metadata__"}


def test_props_against_rdkit(tmp_path):
    from rdkit import Chem
    from rdkit.Chem import Crippen, Descriptors, QED, rdMolDescriptors
    from rdkit.Chem.Scaffolds import MurckoScaffold
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "sa_direct", "/usr/share/RDKit/Contrib/SA_Score/sascorer.py")
    sa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sa)
    smi = tmp_path / "m.smi"
    smi.write_text("\n".join(MOLS[:2] + ["not_a_smiles"] + MOLS[2:]) + "\n")
    p = subprocess.run([sys.executable, "-m", "molgen.props", str(smi), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1 unparsable skipped" in p.stderr
    lines = (tmp_path / "m.csv").read_text().splitlines()
    assert lines[0] == "smiles,logp,qed,sas,tpsa,mw,scaffold"
    rows = [ln.split(",") for ln in lines[1:]]
    assert [r[0] for r in rows] == MOLS
    for r in rows:
        m = Chem.MolFromSmiles(r[0])
        want = [Crippen.MolLogP(m), QED.qed(m), sa.calculateScore(m),
                rdMolDescriptors.CalcTPSA(m), Descriptors.MolWt(m)]
        for got, w in zip(r[1:6], want):
            assert abs(float(got) - w) <= 5e-5 + 1e-9 * abs(w), (r, want)
        scaf = Chem.MolToSmiles(MurckoScaffold.GetScaffoldForMol(m))
        assert r[6] == scaf, (r, scaf)
    assert rows[2][6] == ""  # ethanol has no ring


def synthetic_csv(path, n=2000, seed=1):
    """SMILES C..C + O or N; column 'o' = 1 when it ends with O."""
    r = random.Random(seed)
    with open(path, "w") as f:
        f.write("smiles,o\n")
        for _ in range(n):
            e = r.random() < 0.5
            f.write("C" * r.randint(2, 10) + ("O" if e else "N") + ",%d\n" % e)


@pytest.mark.parametrize("prefix,decode,constrain", [(False, "kv", "none"), (True, "kv", "none"),
                                                     (True, "naive", "none"),
                                                     (False, "kv", "valence")])
def test_obeys_a_synthetic_condition(tmp_path, prefix, decode, constrain):
    csv = str(tmp_path / "syn.csv")
    synthetic_csv(csv)
    model = str(tmp_path / "m.safetensors")
    run(["train", "--data", csv, "--condition", "o", "--layers", "1", "--d-model", "32",
         "--heads", "2", "--steps", "300", "--batch-size", "32", "--out", model, "--threads", "1",
         "--quiet"] + (["--condition-prefix"] if prefix else []))
    share = {}
    for v in ("0", "1", None):
        out = str(tmp_path / ("s%s.smi" % v))
        run(["sample", "--model", model, "-n", "300", "--out", out, "--threads", "1",
             "--decode", decode, "--constrain", constrain] +
            (["--condition", "o=" + v] if v else []))
        mols = open(out).read().split()
        share[v] = sum(m.endswith("O") for m in mols) / len(mols)
    # without the condition the model samples the data's 50/50 mixture
    assert share["1"] >= 0.95 and share["0"] <= 0.05, share
    assert 0.25 <= share[None] <= 0.75, share


def test_normalisation_in_checkpoint(tmp_path):
    r = random.Random(3)
    mols = first_molecules(200)
    xs = [r.gauss(3.0, 2.0) for _ in mols]
    ys = [r.uniform(0, 1) for _ in mols]
    csv = tmp_path / "c.csv"
    with open(csv, "w") as f:
        f.write("smiles,x,y\n")
        for i, (m, x, y) in enumerate(zip(mols, xs, ys)):
            # row 7 empty, row 11 beyond float range (would be inf): both missing
            f.write("%s,%s,%.6f\n" % (m, {7: "", 11: "1e39"}.get(i, "%.6f" % x), y))
    model = str(tmp_path / "m.safetensors")
    p = run(["train", "--data", str(csv), "--condition", "x,y", "--val-frac", "0", "--layers", "1",
             "--d-model", "16", "--heads", "2", "--steps", "2", "--batch-size", "8", "--out", model,
             "--threads", "1", "--no-progress"])
    assert "2 missing value(s)" in p.stderr
    h, _ = load_st(model)
    meta = json.loads(h["__metadata__"]["condition"])
    assert meta["names"] == ["x", "y"]
    cfg = json.loads(h["__metadata__"]["config"])
    assert cfg["n_cond"] == 2 and cfg["cond_bos"] is False
    assert h["cond.weight"]["shape"] == [2, 16] and h["cond.missing"]["shape"] == [2, 16]
    for k, col in enumerate((xs, ys)):
        v = np.array([float("%.6f" % c) for i, c in enumerate(col) if not (k == 0 and i in (7, 11))],
                     dtype=np.float32).astype(np.float64)
        assert meta["mean"][k] == pytest.approx(v.mean(), rel=1e-6)
        assert meta["std"][k] == pytest.approx(v.std(ddof=1), rel=1e-6)
        assert meta["min"][k] == pytest.approx(v.min(), rel=1e-6)
        assert meta["max"][k] == pytest.approx(v.max(), rel=1e-6)
    # the normalisation travels to sampling: a value is refused outside [min, max]
    bad = run(["sample", "--model", model, "--condition", "y=%g" % (max(ys) + 0.5), "-n", "2",
               "--out", str(tmp_path / "s.smi")], ok=False)
    assert bad.returncode == 2 and "outside the training range" in bad.stderr
    ok = run(["sample", "--model", model, "--condition", "y=0.5", "-n", "2",
              "--out", str(tmp_path / "s.smi")])
    assert "drawn as in the data: x" in ok.stderr


def test_resume_bit_for_bit(tmp_path):
    csv = str(tmp_path / "syn.csv")
    synthetic_csv(csv, n=400)
    common = ["--data", csv, "--condition", "o", "--condition-drop", "0.3", "--layers", "1",
              "--d-model", "16", "--heads", "2", "--steps", "20", "--batch-size", "8",
              "--threads", "1", "--quiet", "--seed", "5"]
    a, b = str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")
    run(["train"] + common + ["--out", a])
    run(["train"] + common + ["--out", b, "--stop-after", "10"])
    run(["train", "--resume", b, "--threads", "1", "--quiet"])
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys() and "cond.weight" in ta
    assert all(ta[k] == tb[k] for k in ta), [k for k in ta if ta[k] != tb[k]]


def test_refusals(tmp_path):
    csv = str(tmp_path / "syn.csv")
    synthetic_csv(csv, n=200)
    model = str(tmp_path / "m.safetensors")
    run(["train", "--data", csv, "--condition", "o", "--layers", "1", "--d-model", "16",
         "--heads", "2", "--steps", "2", "--batch-size", "8", "--out", model, "--quiet"])
    out = str(tmp_path / "s.smi")
    for cond, msg in [("qed=0.5", "not trained on a condition 'qed' (it knows: o)"),
                      ("o=3", "outside the training range [0, 1]"),
                      ("o=x", "not a finite number"), ("o=1,o=0", "given twice"),
                      ("o", "not name=value")]:
        p = run(["sample", "--model", model, "--condition", cond, "-n", "2", "--out", out],
                ok=False)
        assert p.returncode == 2 and msg in p.stderr, (cond, p.stderr)
    p = run(["sample", "--model", SHIPPED, "--condition", "logp=2", "-n", "2", "--out", out],
            ok=False)
    assert p.returncode == 2 and "unconditional model" in p.stderr
    # the shipped unconditional model still loads and samples
    run(["sample", "--model", SHIPPED, "-n", "20", "--out", out])
    assert len(open(out).read().splitlines()) == 20
    smi = tmp_path / "x.smi"
    smi.write_text("CCO\nCCN\n" * 20)
    for args, msg in [(["--data", str(smi), "--condition", "o"], "needs a .csv data file"),
                      (["--data", csv, "--condition", "logp"], "no column named 'logp'"),
                      (["--data", csv, "--condition", "o,o"], "named twice"),
                      (["--data", csv, "--condition-prefix"], "--condition-prefix needs"),
                      (["--data", csv, "--condition", "smiles"], "is the SMILES column")]:
        p = run(["train"] + args + ["--steps", "1", "--batch-size", "4", "--layers", "1",
                                    "--d-model", "8", "--heads", "1", "--out",
                                    str(tmp_path / "t.safetensors"), "--quiet"], ok=False)
        assert p.returncode != 0 and msg in p.stderr, (args, p.stderr)


def test_metrics_condition(tmp_path):
    from rdkit import Chem, DataStructs
    from rdkit.Chem import AllChem, Crippen, rdMolDescriptors
    from rdkit.Chem.Scaffolds import MurckoScaffold
    samples = tmp_path / "s.smi"
    # 2 invalid samples, and one that RDKit parses but whose canonical SMILES
    # it cannot parse again (a molgen sample): left out of MAD and shares
    samples.write_text("\n".join(MOLS + ["C1CC", "", ROUND_TRIP_FAILS]) + "\n")
    js = str(tmp_path / "m.json")
    p = subprocess.run([sys.executable, "-m", "molgen.metrics", str(samples),
                        "--condition", "logp=2,tpsa=40", "--scaffold", "c1ccccc1", "--json", js,
                        "-q", "--jobs", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    c = json.load(open(js))["condition"]
    assert Chem.MolFromSmiles(Chem.MolToSmiles(Chem.MolFromSmiles(ROUND_TRIP_FAILS))) is None
    assert c["n_valid"] == 6 and c["n_round_trip_failed"] == 1 and c["n_used"] == 5
    mols = [Chem.MolFromSmiles(s) for s in MOLS]
    for name, t, f in (("logp", 2.0, Crippen.MolLogP), ("tpsa", 40.0, rdMolDescriptors.CalcTPSA)):
        dev = np.array([f(m) - t for m in mols])
        assert c["properties"][name]["MAD"] == pytest.approx(np.abs(dev).mean(), rel=1e-9)
        assert c["properties"][name]["SD"] == pytest.approx(dev.std(), rel=1e-9)
    scafs = [Chem.MolToSmiles(MurckoScaffold.GetScaffoldForMol(m)) for m in mols]
    assert c["scaffold"]["exact_share"] == pytest.approx(scafs.count("c1ccccc1") / 5)
    ref = AllChem.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles("c1ccccc1"), 2, nBits=1024)
    sims = [DataStructs.TanimotoSimilarity(
        ref, AllChem.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles(s), 2, nBits=1024))
        if s else 0.0 for s in scafs]
    assert c["scaffold"]["mean_tanimoto"] == pytest.approx(np.mean(sims), rel=1e-9)
    bad = subprocess.run([sys.executable, "-m", "molgen.metrics", str(samples),
                          "--condition", "foo=1", "-q"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "foo=1" in bad.stderr


def test_cond_svg(tmp_path):
    """molgen.pictures: well-formed SVG, one curve per series, the MAD it prints
    equal to RDKit's."""
    import xml.etree.ElementTree as ET
    from rdkit import Chem
    from rdkit.Chem import Crippen
    data = tmp_path / "d.csv"
    data.write_text("smiles,logp\n" + "".join("x,%g\n" % (0.1 * i) for i in range(50)))
    s = tmp_path / "s.smi"
    s.write_text("\n".join(MOLS + ["C1CC"]) + "\n")
    out = str(tmp_path / "p.svg")
    p = subprocess.run([sys.executable, "-m", "molgen.pictures", "--data",
                        str(data), "--out", out, "logp=2:%s" % s, "logp=3:%s" % s],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    root = ET.parse(out).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(ns + "polyline")) == 2
    texts = [t.text for t in root.iter(ns + "text")]
    mad = np.mean([abs(Crippen.MolLogP(Chem.MolFromSmiles(m)) - 2) for m in MOLS])
    assert "logp = 2: MAD %.3f (5 valid)" % mad in texts, texts
    bad = subprocess.run([sys.executable, "-m", "molgen.pictures", "--data",
                          str(data), "--out", out, "qed=2:%s" % s], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "no column qed" in bad.stderr
