"""molgen's commands as a careless user or an attacker uses them:
every case ends in a clear one-line error or the right behaviour, and
nothing is lost (the inputs, the previous checkpoint). Each test runs the
molgen binary ($MOLGEN_BIN, else <dir of $ATTN_LIBRARY>/molgen/molgen, else
build/molgen/molgen) in a subprocess, so a crash is a failure, not the end of
the suite."""
import hashlib
import json
import os
import re
import resource
import struct
import subprocess
import zlib

import pytest

from molgen_bin import molgen_binary, write_molecules  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "8",
        "--no-progress", "--val-every", "0", "--threads", "1"]


def run(args, timeout=120, fsize=None, cwd=None):
    def limit():
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    return subprocess.run([molgen_binary()] + args, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, cwd=cwd,
                          env=dict(os.environ, OPENBLAS_CORETYPE="Haswell"))


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def one_error_line(p):
    """rc != 0 (not a signal) and one line on stderr."""
    assert p.returncode not in (0,) and p.returncode < 128, (p.returncode, p.stderr)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def smiles(tmp_path_factory):
    """The first 300 molecules of the shipped sample."""
    return write_molecules(tmp_path_factory.mktemp("data"), 300)


@pytest.fixture(scope="module")
def model(smiles, tmp_path_factory):
    """A tiny trained checkpoint (4 steps)."""
    path = str(tmp_path_factory.mktemp("model") / "tiny.safetensors")
    p = run(["train", "--data", smiles[0], "--steps", "4", "--out", path] + TINY)
    assert p.returncode == 0, p.stderr
    return path


# ---- 3. an output over an input

def test_sample_out_over_model_refused(model, tmp_path):
    before = digest(model)
    link = tmp_path / "link.safetensors"
    link.symlink_to(model)
    hard = tmp_path / "hard.safetensors"
    os.link(model, hard)
    for out in (model, str(link), str(hard)):
        p = run(["sample", "--model", model, "-n", "5", "--out", out])
        assert "same file" in one_error_line(p)
    assert digest(model) == before


def test_train_out_over_data_refused(smiles, tmp_path):
    data = tmp_path / "d.smi"
    data.write_text(open(smiles[0]).read())
    before = digest(data)
    p = run(["train", "--data", str(data), "--steps", "2", "--out", str(data)] + TINY)
    assert "same file" in one_error_line(p)
    assert digest(data) == before


# ---- 4. and 6. outputs checked before any work

def test_attention_empty_out_refused(model):
    p = run(["attention", "--model", model, "--smiles", "CCO", "--out", ""])
    assert "empty" in one_error_line(p)


@pytest.mark.parametrize("kind", ["empty", "directory", "unwritable"])
def test_train_bad_out_fails_before_training(smiles, tmp_path, kind):
    out = {"empty": "", "directory": str(tmp_path),
           "unwritable": "/proc/molgen-test.safetensors"}[kind]
    p = run(["train", "--data", smiles[0], "--steps", "200", "--out", out] + TINY)
    line = one_error_line(p)
    assert "--out" in line and "model:" not in p.stderr


def test_sample_bad_out_fails_before_sampling(model, tmp_path):
    p = run(["sample", "--model", model, "-n", "5", "--out", str(tmp_path)])
    assert "is a directory" in one_error_line(p)


# ---- 5. an overlong line does not take over the run

def test_overlong_line_skipped_and_counted(smiles, tmp_path):
    data = tmp_path / "long.smi"
    mols = smiles[1]
    data.write_text("\n".join(mols[:100] + ["C" * 30000] + mols[100:]) + "\n")
    out = str(tmp_path / "m.safetensors")
    p = run(["train", "--data", str(data), "--steps", "1", "--out", out] + TINY)
    assert p.returncode == 0, p.stderr
    assert "long.smi:101: too long: 30000 tokens, more than the model's limit 256" in p.stderr
    summary = json.loads(p.stdout)
    assert summary["skipped_lines"] == 1
    ctx = int(re.search(r"ctx (\d+)", p.stderr).group(1))
    assert ctx <= 60  # the longest kept molecule + 1, not 30001


def test_huge_line_bounded(tmp_path):
    data = tmp_path / "huge.smi"
    with open(data, "w") as f:
        f.write("CCO\n" * 50 + "C" * (3 << 20) + "\n" + "CCN\n" * 50)
    out = str(tmp_path / "m.safetensors")
    p = run(["train", "--data", str(data), "--steps", "1", "--out", out] + TINY)
    assert p.returncode == 0, p.stderr
    assert "huge.smi:51: line of 3145728 bytes, longer than the 1048576-byte limit" in p.stderr


# ---- 7. SIGXFSZ: a write past the file-size limit is an ordinary error

def test_file_size_limit_keeps_previous_checkpoint(smiles, tmp_path):
    out = str(tmp_path / "ck.safetensors")
    p = run(["train", "--data", smiles[0], "--steps", "2", "--out", out] + TINY)
    assert p.returncode == 0, p.stderr
    before = digest(out)
    size = os.path.getsize(out)
    p = run(["train", "--resume", out, "--steps", "4", "--out", out, "--quiet"],
            fsize=size // 2)
    line = one_error_line(p)
    assert "File too large" in line
    assert digest(out) == before
    assert [f for f in os.listdir(tmp_path) if ".tmp." in f] == []


def test_sample_file_size_limit_leaves_nothing(model, tmp_path):
    out = tmp_path / "s.smi"
    p = run(["sample", "--model", model, "-n", "3000", "--out", str(out)], fsize=4096)
    assert "File too large" in one_error_line(p)
    assert sorted(os.listdir(tmp_path)) == []


# ---- 8. --resume with fewer steps than the checkpoint has done

def test_resume_steps_behind_checkpoint_refused(smiles, tmp_path):
    out = str(tmp_path / "ck.safetensors")
    assert run(["train", "--data", smiles[0], "--steps", "4", "--out", out] + TINY).returncode == 0
    before = digest(out)
    p = run(["train", "--resume", out, "--steps", "2"])
    line = one_error_line(p)
    assert "at step 4 of a 4-step schedule" in line and "--steps 2" in line
    assert digest(out) == before


# ---- 11. non-regular input

def test_dev_zero_refused(tmp_path):
    p = run(["train", "--data", "/dev/zero", "--steps", "1", "--out", str(tmp_path / "x.safetensors")],
            timeout=20)
    assert "not a regular file" in one_error_line(p)


# ---- 12. stale temporary files of dead writers

def test_stale_temp_files_removed(smiles, tmp_path):
    out = str(tmp_path / "ck.safetensors")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / ("ck.safetensors.tmp.%d" % dead.pid)
    stale.write_bytes(b"x" * 1000)
    keep = tmp_path / "ck.safetensors.tmp.1"  # pid 1 is alive: not ours to remove
    keep.write_bytes(b"y")
    p = run(["train", "--data", smiles[0], "--steps", "1", "--out", out] + TINY)
    assert p.returncode == 0, p.stderr
    assert not stale.exists() and keep.exists()
    assert "removed 1 stale temporary file" in p.stderr


# ---- 13. CR-only line ends

def test_cr_only_line_ends(smiles, tmp_path):
    data = tmp_path / "mac.smi"
    data.write_bytes("\r".join(smiles[1]).encode() + b"\r")
    out = str(tmp_path / "m.safetensors")
    p = run(["train", "--data", str(data), "--steps", "1", "--out", out] + TINY)
    assert p.returncode == 0, p.stderr
    assert "read 300 lines, 300 records, kept 300" in p.stderr


# ---- 14. ranges and messages

@pytest.mark.parametrize("args", [["--dropout", "-0.1"], ["--grad-clip", "-1"],
                                  ["--seed", " -1"], ["--seed", "0x10"],
                                  ["--time-limit", "1e300"], ["--seed", "18446744073709551616"]])
def test_train_option_ranges(smiles, tmp_path, args):
    out = str(tmp_path / "m.safetensors")
    p = run(["train", "--data", smiles[0], "--steps", "1", "--out", out] + TINY + args)
    one_error_line(p)
    assert not os.path.exists(out)


def test_long_smiles_echo_is_cut(model, tmp_path):
    p = run(["attention", "--model", model, "--smiles", "C" * 100000, "--out", str(tmp_path)])
    line = one_error_line(p)
    assert len(line) < 400 and "(100000 chars)" in line


def test_missing_model_path_named_once(tmp_path):
    missing = str(tmp_path / "nope.safetensors")
    line = one_error_line(run(["sample", "--model", missing, "--out", str(tmp_path / "s.smi")]))
    assert line.count(missing) == 1


def test_bench_bad_data_fails_before_benchmarking():
    p = run(["bench", "--data", "/nonexistent.smi", "--runs", "1"])
    assert "/nonexistent.smi" in one_error_line(p)
    assert "sampling" not in p.stdout


# ---- weights integrity

def _header(path):
    raw = bytearray(open(path, "rb").read())
    (n,) = struct.unpack("<Q", raw[:8])
    return raw, n, json.loads(raw[8:8 + n])


def _write(path, raw, n, hdr):
    text = json.dumps(hdr, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + bytes(raw[8 + n:]))


def test_flipped_weight_byte_refused(model, tmp_path):
    raw, n, hdr = _header(model)
    b, e = hdr["tok_emb.weight"]["data_offsets"]
    raw[8 + n + b + 5] ^= 0x04
    bad = str(tmp_path / "flipped.safetensors")
    open(bad, "wb").write(bytes(raw))
    line = one_error_line(run(["sample", "--model", bad, "-n", "2", "--out", str(tmp_path / "s")]))
    assert "tensor 'tok_emb.weight' fails its checksum" in line


def test_checksums_match_python_zlib(model):
    raw, n, hdr = _header(model)
    table = json.loads(hdr["__metadata__"]["crc32"])
    buf = bytes(raw[8 + n:])
    names = [k for k in hdr if k != "__metadata__"]
    assert sorted(table) == sorted(names)
    for k in names:
        b, e = hdr[k]["data_offsets"]
        assert int(table[k], 16) == zlib.crc32(buf[b:e]), k


def test_non_finite_weight_refused(model, tmp_path):
    """An Inf weight with a valid checksum (the writer saved it so) is refused
    by name, not sampled into '((((((' strings."""
    raw, n, hdr = _header(model)
    name = "ln_f.weight"
    b, e = hdr[name]["data_offsets"]
    raw[8 + n + b:8 + n + b + 4] = struct.pack("<f", float("inf"))
    table = json.loads(hdr["__metadata__"]["crc32"])
    table[name] = "%08x" % zlib.crc32(bytes(raw[8 + n + b:8 + n + e]))
    hdr["__metadata__"]["crc32"] = json.dumps(table)
    bad = str(tmp_path / "inf.safetensors")
    _write(bad, raw, n, hdr)
    line = one_error_line(run(["sample", "--model", bad, "-n", "2", "--out", str(tmp_path / "s")]))
    assert "tensor '%s' holds a non-finite value (inf at element 0)" % name in line


def test_checkpoint_without_checksums_loads_with_note(model, tmp_path):
    raw, n, hdr = _header(model)
    del hdr["__metadata__"]["crc32"]
    old = str(tmp_path / "old.safetensors")
    _write(old, raw, n, hdr)
    p = run(["sample", "--model", old, "-n", "3", "--out", str(tmp_path / "s.smi")])
    assert p.returncode == 0, p.stderr
    assert "has no tensor checksums" in p.stderr
