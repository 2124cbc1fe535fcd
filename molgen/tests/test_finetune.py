"""molgen train --init / --freeze from the command line, with Python's own
readers as the oracles: the checkpoint's "train" metadata names the init
file and holds zlib.crc32 of its parameters (in the tensor table's order,
the PyTorch twin's named_parameters order); the frozen tensors read back
with torch_model.load_safetensors are bitwise the init's, the others
changed; lines outside the init's vocabulary or context are reported as
file:line and counted in the summary; conflicting model options are
refused with a message that says why."""
import json
import os
import subprocess
import zlib

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
MOLGEN_DIR = os.path.dirname(HERE)
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
    focused.write_text("".join(lines) + "CC[Se]CC\n" + "C" * 200 + "\n")
    out = str(d / "ft.safetensors")
    p = train(["--init", path, "--data", str(focused), "--steps", "4", "--freeze", "1",
               "--lr", "1e-3", "--batch-size", "16", "--out", out])
    assert p.returncode == 0, p.stderr
    err = p.stderr.decode()
    assert "focused.smi:101: unknown token '[Se]' at position 2" in err
    assert "focused.smi:102: too long" in err
    summary = json.loads(p.stdout.decode().strip().splitlines()[-1])
    assert summary["skipped_lines"] == 2 and summary["init"] == path

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
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--freeze", "3", "--out", out])
    assert p.returncode == 1 and b"cannot freeze 3 blocks of a 2-block model" in p.stderr
    (d / "alien.smi").write_text("C[Se]C\nC[Te]C\n")
    p = train(["--init", path, "--data", str(d / "alien.smi"), "--steps", "2", "--out", out])
    assert p.returncode == 1 and b"no molecule fits --init" in p.stderr
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--condition", "logp", "--out", out])
    assert p.returncode == 1 and b"fine-tuning with --condition is not supported" in p.stderr
    p = train(["--init", path, "--data", DATA, "--steps", "2", "--out", path])
    assert p.returncode == 1 and b"refusing to overwrite" in p.stderr
    assert not os.path.exists(out)
