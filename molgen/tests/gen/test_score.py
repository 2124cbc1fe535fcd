"""molgen score against the PyTorch twin (molgen.torch_model) and as a
command: per-molecule NLL equal to PyTorch's float64 cross-entropy summed
over the same targets (every token after BOS, EOS included), the same CSV
bytes for any --threads / --batch, stdin -> stdout in a pipe, and a status
and a detail (the missing token, the length and the model's limit) for
every row that cannot be scored.

Tolerance: |nll_C - nll_torch| <= 1e-5 * nll_torch + 2e-6 (fp32 model vs
fp64 oracle; the CSV has 6 decimals). Measured worst: see the printed line
(pytest -s).

Every test of `molgen score` is found from here: this file, gen/test_score.c
(the engine against the training-loss path), gen/test_score_bf16.py
(--dtype bf16), and SCORE_ELSEWHERE below, the tests of other subjects that
run score too (tools/test_score_index.py keeps that list complete)."""
import csv
import io
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(os.path.dirname(HERE))
REPO = os.path.dirname(MOLGEN_DIR)

from molgen_bin import molgen_binary, run_molgen  # noqa: E402

# Tests of other subjects that run `molgen score` (molgen/tests/...::test).
SCORE_ELSEWHERE = [
    "base/test_outputs.py::test_score_out_character_device",
    "base/test_outputs.py::test_two_resumes_one_checkpoint",
    "base/test_outputs.py::test_held_lock_refuses_sample_and_score",
    "cli/test_cli_edge_inputs.py::test_signal_exits_128_plus_signal",
    "metrics/test_guacamol.py::test_split_is_the_validation_molgen_train_used",
    "mpi/test_mpi.py::test_score_same_file",
    "mpi/test_mpi.py::test_score_ranks_disagree_refused",
    "mpi/test_mpi.py::test_usage_error_said_once_refused",
    "train/test_checkpoint_validation.py::test_every_load_path_refuses",
    "train/test_checkpoint_validation.py::test_tampered_normalisation_refused_at_load",
    "train/test_ema.py::test_score_uses_the_average_and_raw_on_request",
    "train/test_extend_vocab.py::test_step0_probabilities_of_old_tokens_unchanged",
    "train/test_extend_vocab.py::test_extended_model_is_read_by_sample_score_and_a_second_init",
    "train/test_finetune_small_sets.py::test_too_long_one_wording",
    "train/test_prior_torch_training.py::test_output_is_a_molgen_model",
]

MODEL = os.path.join(REPO, "models", "molgen-moses.safetensors")
DATA = os.path.join(REPO, "data", "moses_20k.smi")
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def first_smiles(n):
    out = []
    with open(DATA) as f:
        for line in f:
            if line.strip():
                out.append(line.split()[0])
            if len(out) == n:
                break
    return out


def score(args, stdin=None):
    p = subprocess.run([molgen_binary(), "score", "--model", MODEL] + args, input=stdin,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, check=False)
    return p


def rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def test_nll_equals_pytorch_twin(tmp_path):
    torch = pytest.importorskip("torch")
    from molgen import torch_model as tm
    smiles = first_smiles(120)
    path = tmp_path / "in.smi"
    path.write_text("\n".join(smiles) + "\n")
    p = score(["--smiles", str(path), "--threads", "2"])
    assert p.returncode == 0, p.stderr
    got = rows(p.stdout.decode())
    assert [r["smiles"] for r in got] == smiles and all(r["status"] == "ok" for r in got)
    model, vocab = tm.load_model(MODEL, torch.float64)
    nll, ntok = tm.molecule_nll(model, vocab, smiles)
    worst = 0.0
    for i, r in enumerate(got):
        n, ref = ntok[i], nll[i]
        assert int(r["tokens"]) == n
        err = abs(float(r["nll"]) - ref)
        worst = max(worst, err / ref)
        assert err <= 1e-5 * ref + 2e-6, (i, r["nll"], ref)
        assert abs(float(r["nll_per_token"]) - ref / n) <= 1e-5 * ref / n + 2e-6
    print("score vs PyTorch float64 twin: %d molecules, worst relative error %.2e" % (len(got), worst))


def test_deterministic_threads_batch_and_pipe(tmp_path):
    smiles = first_smiles(150)
    text = ("\n".join(smiles) + "\n").encode()
    path = tmp_path / "in.smi"
    path.write_bytes(text)
    outs = []
    for threads, batch in [(1, 1), (2, 7), (3, 64), (2, 1)]:
        out = tmp_path / ("o_%d_%d.csv" % (threads, batch))
        p = score(["--smiles", str(path), "--out", str(out), "--threads", str(threads),
                   "--batch", str(batch)])
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert all(o == outs[0] for o in outs[1:])
    p = score(["--smiles", "-", "--threads", "3", "--quiet"], stdin=text)  # a pipe both ways
    assert p.returncode == 0 and p.stdout == outs[0] and p.stderr == b""


def test_bad_rows_get_a_status(tmp_path):
    path = tmp_path / "bad.smi"
    long = "C" * 200  # longer than the shipped model's context
    path.write_bytes(b"CCO\n\nCC[Se]C\nc1ccX\n" + long.encode() + b"\nC\x00C\n#note\nCCN name\n")
    p = score(["--smiles", str(path)])
    assert p.returncode == 0, p.stderr
    got = rows(p.stdout.decode())
    assert [(r["line"], r["status"]) for r in got] == [
        ("1", "ok"), ("2", "empty"), ("3", "unknown_token"), ("4", "bad_char"), ("5", "too_long"),
        ("6", "bad_line"), ("8", "ok")]
    assert got[4]["tokens"] == "201" and got[4]["nll"] == "" and got[7 - 1]["smiles"] == "CCN"
    # detail: what to do about a row (the token the model lacks; the length
    # and the model's limit: its ctx_len - 1 SMILES tokens after BOS, read
    # from the file's config)
    import json
    with open(MODEL, "rb") as f:
        hdr = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    limit = json.loads(hdr["__metadata__"]["config"])["ctx_len"] - 1
    assert [r["detail"] for r in got] == [
        "", "empty SMILES", "unknown token '[Se]' at position 2",
        "position 4: cannot tokenise 'X'", "200 tokens, more than the model's limit %d" % limit,
        "NUL byte in line", ""]
    err = p.stderr.decode()
    assert "bad.smi:3: unknown_token: unknown token '[Se]'" in err
    assert "ok 2, empty 1, bad_char 1, unknown_token 1, too_long 1, bad_line 1" in err
    # CSV in, a field that needs quoting out
    cpath = tmp_path / "in.csv"
    cpath.write_text('name,smiles\na,CCO\nb\nc,"C,C"\n')
    p = score(["--smiles", str(cpath)])
    got = rows(p.stdout.decode())
    assert [(r["smiles"], r["status"]) for r in got] == [("CCO", "ok"), ("", "bad_line"),
                                                        ("C,C", "bad_char")]


def test_refusals(tmp_path):
    p = score(["--smiles", str(tmp_path / "missing.smi")])
    assert p.returncode == 1 and b"cannot open" in p.stderr
    p = score(["--smiles", DATA, "--out", DATA])
    assert p.returncode == 1 and b"--out" in p.stderr
    p = score([])
    assert p.returncode == 2
    h = subprocess.run([molgen_binary(), "--help"], stdout=subprocess.PIPE, env=ENV, check=True)
    assert b"score" in h.stdout


@pytest.fixture
def model():
    """The shipped model: neither [Xe] nor an empty line is in its words."""
    return MODEL


def test_score_nothing_scored_says_so(model, tmp_path):
    smi = tmp_path / "bad.smi"
    smi.write_text("C[Xe]\n\n")
    p = run_molgen(["score", "--model", model, "--smiles", str(smi), "--out",
                    str(tmp_path / "o.csv")])
    summary = [l for l in p.stderr.splitlines() if l.startswith("scored ")]
    assert len(summary) == 1, p.stderr
    assert "nan" not in summary[0].lower(), summary[0]
    assert "no mean NLL (no molecule ok)" in summary[0], summary[0]
    # the rows: no ok row, so no nll field anywhere
    import csv
    with open(str(tmp_path / "o.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["unknown_token", "empty"]
    assert [r["nll"] for r in rows] == ["", ""]
