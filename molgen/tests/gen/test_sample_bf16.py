"""molgen sample --dtype bf16 (packed bf16 weights, bf16 KV cache): the
shipped model's samples are valid SMILES (RDKit) at the fp32 rate.

600 molecules each, the same seed: with validity p ~ 0.95 the standard
deviation of one rate is sqrt(p (1 - p) / 600) ~ 0.9 points, of the
difference of two independent rates ~ 1.3 points; the test allows 4 points
(3 sd), so a bf16 path that breaks decoding (garbage logits give validity
far below 50 %) fails, and rounding noise does not. Also: bf16 samples are
not the fp32 ones (the option reaches the decoder), the JSON records the
dtype, and bf16 with the naive decoder is a usage error (exit 2)."""
import json
import os
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

from molgen_bin import molgen_binary  # noqa: E402

MODEL = os.path.join(REPO, "models", "molgen-moses.safetensors")
ENV = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def sample(tmp_path, dtype, n=600):
    out = tmp_path / f"{dtype}.smi"
    subprocess.run([molgen_binary(), "sample", "--model", MODEL, "-n", str(n), "--seed", "11",
                    "--threads", "2", "--dtype", dtype, "--out", str(out)],
                   check=True, env=ENV, capture_output=True)
    return out.read_text().splitlines(), json.loads((tmp_path / f"{dtype}.smi.json").read_text())


def validity(lines):
    Chem = pytest.importorskip("rdkit.Chem")
    from rdkit import RDLogger
    RDLogger.DisableLog("rdApp.*")
    return sum(1 for s in lines if s and Chem.MolFromSmiles(s) is not None) / len(lines)


def test_bf16_validity_at_fp32_rate(tmp_path):
    f32, meta32 = sample(tmp_path, "fp32")
    bf, meta16 = sample(tmp_path, "bf16")
    assert meta32["dtype"] == "fp32" and meta16["dtype"] == "bf16"
    assert len(f32) == len(bf) == 600
    assert f32 != bf, "bf16 samples equal fp32's: the dtype did not reach the decoder"
    v32, v16 = validity(f32), validity(bf)
    print(f"validity fp32 {v32:.4f} bf16 {v16:.4f}")
    assert v32 > 0.85
    assert abs(v16 - v32) <= 0.04, (v32, v16)


def test_bf16_naive_refused(tmp_path):
    r = subprocess.run([molgen_binary(), "sample", "--model", MODEL, "-n", "2", "--dtype", "bf16",
                        "--decode", "naive", "--out", str(tmp_path / "x.smi")],
                       env=ENV, capture_output=True, text=True)
    assert r.returncode == 2 and "--dtype bf16 needs --decode kv" in r.stderr


def cpu_has_bf16():
    """AVX512_BF16 as the kernel reports it (/proc/cpuinfo), not as molgen does."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


@pytest.mark.parametrize("forced", [False, True])
def test_bf16_emulated_note(tmp_path, forced):
    """--dtype bf16 says so where it is emulated: on a CPU without
    AVX512_BF16, or with the portable kernels forced (MOLGEN_GEMM_ISA);
    nothing is said for fp32 or where the CPU multiplies bf16."""
    env = dict(ENV, MOLGEN_GEMM_ISA="portable") if forced else ENV
    said = {}
    for dtype in ("fp32", "bf16"):
        r = subprocess.run([molgen_binary(), "sample", "--model", MODEL, "-n", "4", "--seed", "1",
                            "--dtype", dtype, "--out", str(tmp_path / f"{dtype}.smi")],
                           env=env, capture_output=True, text=True, check=True)
        said[dtype] = "no AVX512_BF16: --dtype bf16 is emulated" in r.stderr
    assert not said["fp32"]
    assert said["bf16"] == (forced or not cpu_has_bf16()), said
