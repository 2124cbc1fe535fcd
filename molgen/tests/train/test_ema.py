"""molgen train --ema: the parameter average as the commands use it.

1. A run with --ema reports the averaged weights' validation loss beside
   the last step's, and the checkpoint holds both.
2. `molgen score` scores with the average by default and with the last
   step's parameters under --raw-weights; each equals the PyTorch float64
   twin's NLL with the same weights (torch_model.load_model, which unpacks
   the flat "ema" tensor itself from the file's layout), and the two differ.
3. `molgen sample` says in its sidecar which weights made the molecules.
4. An out-of-range decay is refused before any work.
The average's update formula and its resume bit for bit are test_train.c's."""
import csv
import io
import json
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

from molgen_bin import run_molgen, write_molecules  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("ema")
    data, mols = write_molecules(d, 400)
    out = str(d / "m.safetensors")
    p = run_molgen(["train", "--data", data, "--steps", "60", "--out", out, "--layers", "2",
                    "--d-model", "32", "--heads", "2", "--batch-size", "16", "--lr", "3e-3",
                    "--warmup", "5", "--ema", "0.95", "--val-every", "0", "--no-progress",
                    "--threads", "2"])
    return out, mols[:60], p


def test_train_reports_both_losses(ckpt):
    out, _, p = ckpt
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert 0 < summary["val_loss_ema"] < summary["first_val_loss"]
    assert summary["val_loss_ema"] != summary["val_loss"]
    assert "averaged weights (--ema 0.95): val loss" in p.stderr


def scored(out, smiles_path, extra):
    p = run_molgen(["score", "--model", out, "--smiles", smiles_path, "--quiet"] + extra)
    return list(csv.DictReader(io.StringIO(p.stdout)))


def test_score_uses_the_average_and_raw_on_request(ckpt, tmp_path):
    torch = pytest.importorskip("torch")
    from molgen import torch_model as tm
    out, mols, _ = ckpt
    path = tmp_path / "in.smi"
    path.write_text("\n".join(mols) + "\n")
    got = {"averaged": scored(out, str(path), []), "raw": scored(out, str(path), ["--raw-weights"])}
    for kind, raw in [("averaged", False), ("raw", True)]:
        model, vocab = tm.load_model(out, torch.float64, raw=raw)
        nll, ntok = tm.molecule_nll(model, vocab, mols)
        rows = got[kind]
        assert [r["status"] for r in rows] == ["ok"] * len(mols)
        for r, ref, n in zip(rows, nll, ntok):
            assert int(r["tokens"]) == n
            assert abs(float(r["nll"]) - ref) <= 1e-5 * ref + 2e-6, (kind, r, ref)
    diff = max(abs(float(a["nll"]) - float(b["nll"])) for a, b in zip(got["averaged"], got["raw"]))
    assert diff > 1e-3, "the averaged and the raw weights score alike"


def test_sample_sidecar_names_the_weights(ckpt, tmp_path):
    out, _, _ = ckpt
    for extra, kind in [([], "averaged"), (["--raw-weights"], "raw")]:
        smi = str(tmp_path / ("s_%s.smi" % kind))
        p = run_molgen(["sample", "--model", out, "-n", "8", "--out", smi] + extra)
        with open(smi + ".json") as f:
            assert json.load(f)["weights"] == kind
        assert ("using its averaged weights" in p.stderr) == (kind == "averaged")


def test_bad_decay_refused(tmp_path):
    data, _ = write_molecules(tmp_path, 50)
    for bad in ["1", "-0.1", "x"]:
        p = run_molgen(["train", "--data", data, "--steps", "2", "--ema", bad,
                        "--out", str(tmp_path / "x.safetensors")], ok=False)
        assert p.returncode != 0 and "--ema" in p.stderr, p.stderr
        assert not os.path.exists(tmp_path / "x.safetensors")
