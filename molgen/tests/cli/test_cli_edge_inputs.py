"""Small inputs at the edges of the commands, single process:
1. a real option kept in a float (--guidance, --temperature, --top-p) that
   the float cannot hold (below FLT_MIN: it would become 0 or a subnormal)
   is refused, naming the option, instead of silently becoming 0;
2. --scaffold is checked with the SMILES grammar (an unclosed ring or
   branch is refused before any work);
3. SIGTERM / SIGINT end sample and score with 128 + the signal (not death
   by the signal), the previous output intact and no temporary left.
The MPI ones (ranks that disagree, usage errors said once) are in
mpi/test_mpi.py; score with nothing scored is in gen/test_score.py, with
every other test of `molgen score`."""
import os
import signal
import subprocess
import time

import pytest

from molgen_bin import ENV, molgen_binary, run_molgen, write_molecules

TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--batch-size", "16",
        "--no-progress", "--quiet", "--threads", "1", "--val-every", "0", "--ckpt-every", "0"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("minor")
    data, _ = write_molecules(d, 500)
    out = str(d / "m.st")
    run_molgen(["train", "--data", data, "--steps", "20", "--out", out] + TINY)
    return out


@pytest.fixture(scope="module")
def scaffold_model(tmp_path_factory):
    """A scaffold model: chains on a benzene, cyclohexane or pyridine ring."""
    d = tmp_path_factory.mktemp("minor_scaffold")
    rings = ["c1ccccc1", "C1CCCCC1", "c1ccncc1"]
    csv = d / "sc.csv"
    rows = ["smiles,scaffold"] + ["%s%s,%s" % ("C" * (1 + i % 4), rings[i % 3], rings[i % 3])
                                  for i in range(300)]
    csv.write_text("\n".join(rows) + "\n")
    out = str(d / "sc.st")
    run_molgen(["train", "--data", str(csv), "--scaffold-column", "scaffold", "--steps", "20",
                "--out", out] + TINY)
    return out


@pytest.mark.parametrize("opt,value", [("--guidance", "1e-300"), ("--temperature", "1e-300"),
                                       ("--top-p", "1e-40"), ("--temperature", "1e-39")])
def test_float_underflow_refused(model, tmp_path, opt, value):
    args = ["sample", "--model", model, "-n", "2", "--out", str(tmp_path / "s.smi"), opt, value]
    if opt == "--guidance":
        args += ["--condition", "x=1"]
    p = run_molgen(args, ok=False)
    assert p.returncode == 2, p.stderr
    assert "molgen sample: %s %s is too small to keep" % (opt, value) in p.stderr, p.stderr
    assert not os.path.exists(str(tmp_path / "s.smi"))


def test_float_smallest_normal_kept(model, tmp_path):
    """2e-38 (above FLT_MIN 1.18e-38) is a float: taken, sampled greedily."""
    out = str(tmp_path / "s.smi")
    run_molgen(["sample", "--model", model, "-n", "2", "--out", out, "--temperature", "2e-38"])
    assert len(open(out).read().splitlines()) == 2


@pytest.mark.parametrize("scaffold,why", [("c1cc", "ring closure 1 never closed"),
                                          ("C1CCCCC", "ring closure 1 never closed"),
                                          ("c1ccccc1C(", "unclosed '('")])
def test_scaffold_grammar_checked(scaffold_model, tmp_path, scaffold, why):
    out = str(tmp_path / "s.smi")
    p = run_molgen(["sample", "--model", scaffold_model, "--scaffold", scaffold, "-n", "3",
                    "--out", out], ok=False)
    assert p.returncode == 2, p.stderr
    assert "molgen sample: --scaffold '%s' is not a complete SMILES" % scaffold in p.stderr
    assert why in p.stderr, p.stderr
    assert not os.path.exists(out)
    # a complete one is taken
    run_molgen(["sample", "--model", scaffold_model, "--scaffold", "c1ccccc1", "-n", "3",
                "--out", out])


@pytest.mark.parametrize("cmd,sig", [("sample", signal.SIGTERM), ("sample", signal.SIGINT),
                                     ("score", signal.SIGTERM), ("score", signal.SIGINT)])
def test_signal_exits_128_plus_signal(model, tmp_path, cmd, sig):
    out = tmp_path / ("o.smi" if cmd == "sample" else "o.csv")
    out.write_text("previous\n")
    if cmd == "sample":
        args = ["sample", "--model", model, "-n", "100000000", "--threads", "1"]
    else:
        big = tmp_path / "big.smi"
        mols = open(write_molecules(tmp_path, 2000)[0]).read()
        big.write_text(mols * 500)  # 1M molecules: minutes of scoring
        args = ["score", "--model", model, "--smiles", str(big), "--threads", "1"]
    p = subprocess.Popen([molgen_binary()] + args + ["--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        time.sleep(2.5)
        assert p.poll() is None, p.communicate()
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert "molgen %s: interrupted by signal %d" % (cmd, sig) in err, err
    assert out.read_text() == "previous\n"
    assert not [f for f in os.listdir(str(tmp_path)) if ".tmp." in f]
