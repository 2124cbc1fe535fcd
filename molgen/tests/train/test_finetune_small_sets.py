"""Fine-tuning sets of 1-39 molecules, and one wording for a molecule too
long for the model, through the binary:

- `train --init` on 1, 2, 3, 5, 20 and 39 molecules with the default batch
  (32) runs: the batch shrinks to the training split (a note says so) and
  the split holds out what fine-tuning holds out (at least 50 or a quarter
  of the set, the fewer; none below 4 molecules, where the last step is
  kept instead of the best);
- a batch size asked for that the training split cannot fill is one error
  line that names --batch-size, --val-frac and the largest batch that fits;
  `--batch-size 1` on 1-2 molecules runs (no keep-best failure);
- `score` and `train` describe the same too-long molecule with the same
  words: "N tokens, more than the model's limit M", N its SMILES tokens, M
  the model's context less the end token.
Oracles: the counts from the documented hold-out rule, the checkpoints'
headers (read here), the molecule's length in characters (one token each)."""
import json
import os
import struct
import subprocess

import pytest

from molgen_bin import ENV, REPO, TINY, molgen_binary, write_molecules  # noqa: E402

SHIPPED = os.path.join(REPO, "models", "molgen-moses.safetensors")


def run(args, **kw):
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=300, env=ENV, **kw)


def meta(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))["__metadata__"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("base")
    data, _ = write_molecules(d, 300)
    out = str(d / "base.safetensors")
    p = run(["train", "--data", data, "--steps", "2", "--out", out, "--quiet"] + TINY)
    assert p.returncode == 0, p.stderr
    return out


def held_out(n):
    """Validation molecules of a fine-tuning run on n molecules (default
    --val-frac 0.1): at least min(50, n // 4)."""
    return max(min(50, n // 4), int(n * 0.1 + 0.5))


FT = ["--steps", "2", "--threads", "1", "--no-progress", "--check-samples", "0"]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20, 39])
def test_small_set_default_batch(base, tmp_path, n):
    data, _ = write_molecules(tmp_path, n)
    out = str(tmp_path / "ft.safetensors")
    p = run(["train", "--init", base, "--data", data, "--out", out] + FT)
    assert p.returncode == 0, p.stderr
    n_train = n - held_out(n)
    assert ("batch size %d: all of the training split's %d molecules (fewer than the default "
            "32; --batch-size sets it)" % (n_train, n_train)) in p.stderr
    assert "%d train / %d validation molecules; batch %d" % (n_train, held_out(n), n_train) \
        in p.stderr
    if held_out(n) == 0:
        assert "keeping the last step (--keep last)" in p.stderr
    assert meta(out)["step"] == "2"


def test_asked_batch_too_large_says_what_to_change(base, tmp_path):
    data, _ = write_molecules(tmp_path, 39)
    out = str(tmp_path / "ft.safetensors")
    p = run(["train", "--init", base, "--data", data, "--out", out, "--batch-size", "32"] + FT)
    assert p.returncode != 0 and not os.path.exists(out)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("molgen train:")]
    assert len(lines) == 1, p.stderr
    n_train = 39 - held_out(39)
    assert "the training split has %d molecules (%d of the 39 held out" % (
        n_train, held_out(39)) in lines[0]
    assert "--val-frac" in lines[0]
    assert "fewer than --batch-size 32: give --batch-size %d or less" % n_train in lines[0]


@pytest.mark.parametrize("n", [1, 2])
def test_batch_one_on_one_or_two(base, tmp_path, n):
    data, _ = write_molecules(tmp_path, n)
    out = str(tmp_path / "ft.safetensors")
    p = run(["train", "--init", base, "--data", data, "--out", out, "--batch-size", "1"] + FT)
    assert p.returncode == 0, p.stderr
    assert meta(out)["step"] == "2"


def test_too_long_one_wording(tmp_path):
    """The shipped model: context 52, so at most 51 tokens before EOS."""
    ctx = json.loads(meta(SHIPPED)["config"])["ctx_len"]
    long_mol = "C" * 59  # 59 tokens
    data, _ = write_molecules(tmp_path, 40)
    with open(data, "a") as f:
        f.write(long_mol + "\n")
    want = "59 tokens, more than the model's limit %d" % (ctx - 1)
    p = run(["score", "--model", SHIPPED, "--smiles", "-", "--threads", "1"],
            input=long_mol + "\n")
    assert p.returncode == 0, p.stderr
    assert "(stdin):1: too_long: " + want in p.stderr
    p = run(["train", "--init", SHIPPED, "--data", data, "--out", str(tmp_path / "o.st")] + FT)
    assert p.returncode == 0, p.stderr
    assert "data.smi:41: too long: " + want in p.stderr.replace("mols.smi", "data.smi")
