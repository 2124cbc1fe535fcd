"""molgen train --resume and the options given with it, and option values
that a float cannot hold or that need another option, refused instead of
changed silently.

1. An option that shapes training (the settings table's SAME column: data
   selection, conditioning, augmentation, model, optimizer, seed, split,
   --ema, --freeze, label smoothing) given with --resume and another value
   than the checkpoint's is refused with a message naming it; the same
   value is accepted; none is silently ignored.
2. Options that do not change the trajectory apply to the resumed run: a
   new --val-every validates at the new interval (the validation lines on
   stderr say so), a larger --steps extends the schedule.
3. --help marks every option of the first kind.
4. --ema 0.99999999 (an average that 32-bit floats cannot move) is refused
   with the largest decay allowed, instead of running as "--ema 1"; a decay
   that fits is shown exactly. --freeze without --init is refused, as its
   help says. --preset with --resume is refused."""
import json
import os
import re
import subprocess

import pytest

from molgen_bin import molgen_binary, write_molecules

ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")
SMALL = ["--layers", "1", "--d-model", "16", "--heads", "2", "--batch-size", "8", "--threads",
         "1", "--no-progress"]


def train(args):
    return subprocess.run([molgen_binary(), "train"] + args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=ENV, universal_newlines=True, check=False)


@pytest.fixture(scope="module")
def half(tmp_path_factory):
    """A run of 6 steps stopped after 2 (validation every 10: only at the
    start and the stop), lr 1e-3, seed 1."""
    d = tmp_path_factory.mktemp("resume_opts")
    data, _ = write_molecules(d, 120)
    ck = str(d / "half.safetensors")
    p = train(["--data", data, "--steps", "6", "--stop-after", "2", "--val-every", "10",
               "--lr", "1e-3", "--out", ck] + SMALL)
    assert p.returncode == 0, p.stderr
    return d, data, ck


# option, a value other than the checkpoint's
OTHER = [
    ("augment", "randomized"),
    ("condition", "logp"),
    ("scaffold-column", "scaffold"),
    ("ema", "0.9"),
    ("freeze", "1"),
    ("seed", "9"),
    ("val-frac", "0.2"),
    ("max-tokens", "100"),
    ("label-smoothing", "0.1"),
    ("lr", "0.003"),
    ("batch-size", "4"),
    ("dropout", "0.1"),
    ("warmup", "3"),
]


@pytest.mark.parametrize("opt,value", OTHER)
def test_another_value_is_refused(half, opt, value):
    d, _, ck = half
    out = str(d / ("r_%s.safetensors" % opt))
    p = train(["--resume", ck, "--%s" % opt, value, "--out", out, "--threads", "1", "--quiet"])
    assert p.returncode == 1, "--%s %s with --resume was accepted" % (opt, value)
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("molgen train: --%s %s with --resume: the checkpoint's" % (opt, value))
    assert "leave --%s out" % opt in line, line
    assert not os.path.exists(out)


def test_the_same_value_is_accepted(half):
    d, data, ck = half
    out = str(d / "same.safetensors")
    p = train(["--resume", ck, "--lr", "1e-3", "--seed", "1", "--val-frac", "0.05", "--data",
               data, "--out", out, "--threads", "1", "--quiet"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["step"] == 6


def test_val_every_and_steps_apply(half):
    d, _, ck = half
    out = str(d / "applied.safetensors")
    p = train(["--resume", ck, "--val-every", "1", "--steps", "8", "--out", out, "--threads",
               "1", "--no-progress"])
    assert p.returncode == 0, p.stderr
    steps = [int(m) for m in re.findall(r"^step (\d+)/8: train loss", p.stderr, re.M)]
    assert steps == [3, 4, 5, 6, 7, 8], p.stderr
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["step"] == 8 and s["total_steps"] == 8
    assert [v[0] for v in s["val_curve"]] == [2, 3, 4, 5, 6, 7, 8]


def test_help_marks_the_options_resume_refuses():
    p = subprocess.run([molgen_binary(), "train", "--help"], stdout=subprocess.PIPE, env=ENV,
                       universal_newlines=True, check=True)
    blocks = re.split(r"\n  (?=--)", p.stdout)
    marked = {re.match(r"--([\w-]+)", b).group(1) for b in blocks
              if b.startswith("--") and "[same on resume]" in " ".join(b.split())}
    for opt, _ in OTHER:
        assert opt in marked, opt
    for opt in ("steps", "time-limit", "threads", "out", "val-every", "keep", "patience"):
        assert opt not in marked, opt


def test_preset_with_resume_refused(half):
    d, _, ck = half
    p = train(["--resume", ck, "--preset", "molgpt", "--out", str(d / "p.safetensors")])
    assert p.returncode == 2 and "--preset with --resume" in p.stderr


def test_ema_beyond_float_refused_and_exact(half):
    d, data, _ = half
    out = str(d / "ema.safetensors")
    p = train(["--data", data, "--steps", "2", "--ema", "0.99999999", "--out", out] + SMALL)
    assert p.returncode == 2, p.stderr
    assert "bad value '0.99999999' for --ema (a number in [0, 0.99999994])" in p.stderr
    assert not os.path.exists(out)
    p = train(["--data", data, "--steps", "2", "--ema", "0.9999999", "--out", out] + SMALL)
    assert p.returncode == 0, p.stderr
    assert "averaged weights (--ema 0.9999999)" in p.stderr, p.stderr


def test_float_settings_that_a_float_cannot_hold(half):
    d, data, _ = half
    out = str(d / "f32.safetensors")
    for opt, v in (("label-smoothing", "0.99999999"), ("lr", "1e-50")):
        p = train(["--data", data, "--steps", "2", "--%s" % opt, v, "--out", out] + SMALL)
        assert p.returncode == 2, (opt, p.stderr)
        assert "bad value '%s' for --%s: a 32-bit float cannot hold it" % (v, opt) in p.stderr


def test_freeze_needs_init(half):
    d, data, _ = half
    out = str(d / "freeze.safetensors")
    p = train(["--data", data, "--steps", "2", "--freeze", "1", "--out", out] + SMALL)
    assert p.returncode == 2 and "--freeze needs --init" in p.stderr, p.stderr
    assert not os.path.exists(out)
