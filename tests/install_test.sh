#!/usr/bin/env bash
# ctest "install": `cmake --install BUILD --prefix P` into a temporary P, then
# everything from P alone, run from a directory outside the source tree:
#   - the README's C example (examples/hello_attn.c) compiled with
#     `pkg-config --cflags --libs attn` (PKG_CONFIG_PATH=P/lib/pkgconfig), and
#     once more against P/lib/libattn.a; both runs checked against a numpy
#     fp64 causal SDPA of the same inputs;
#   - P/bin/molgen --version, and a small sample with an explicit --model copy;
#   - `import attn` with /usr/bin/python3 from P's site directory
#     (PYTHONPATH=that, no ATTN_LIBRARY), which must load P's libattn, and a
#     causal SDPA checked against numpy fp64;
#   - `import molgen.metrics` from the same site directory, with
#     molgen.moses_filters and the lists it reads (22 + 480 patterns), and with RDKit
#     `python3 -m molgen.metrics` on 4 lines whose validity, uniqueness and
#     novelty are counted by hand; python/pyproject.toml's version is the
#     project's.
# Usage: install_test.sh BUILD_DIR CC PYTHON VERSION HAVE_MOLGEN(0|1)
# Exit 77 (ctest: skipped) when PYTHON with numpy is not there: it is the oracle.
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: install_test.sh BUILD_DIR CC PYTHON VERSION HAVE_MOLGEN SONAME" >&2; exit 2; }
build=$1 cc=$2 py=$3 version=$4 have_molgen=$5 soname=$6 # soname: libattn.so.SOVERSION
src=$(cd "$(dirname "$0")/.." && pwd)

if ! "$py" -c 'import numpy' >/dev/null 2>&1; then
    echo "install test skipped: $py with numpy (its oracle) not found; apt-get install python3-numpy"
    exit 77
fi
command -v pkg-config >/dev/null || { echo "FAIL: pkg-config not found (apt-get install pkg-config)"; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/attn-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
P=$tmp/prefix
work=$tmp/work
mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }

# nothing from the caller's environment may point back at the build
unset ATTN_LIBRARY PYTHONPATH LD_LIBRARY_PATH PKG_CONFIG_PATH

if ! cmake --install "$build" --prefix "$P" > "$tmp/install.log" 2>&1; then
    cat "$tmp/install.log"
    fail "cmake --install $build --prefix $P"
fi
for f in lib/libattn.so lib/libattn.a include/attn.h lib/pkgconfig/attn.pc; do
    [ -e "$P/$f" ] || fail "not installed: P/$f"
done
nm -g --defined-only "$P/lib/libattn.a" | grep ' T attn_sdpa_forward$' >/dev/null || fail "libattn.a lacks attn_sdpa_forward"

# The oracle: causal softmax(Q K^T / sqrt(2)) V in fp64 for hello_attn's
# inputs, printed as "o0 o1 w0 w1 w2" per row.
"$py" - > "$tmp/expected.txt" <<'EOF'
import numpy as np
q = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float64)
k = q.copy()
v = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float64)
s = q @ k.T / np.sqrt(2.0)
s[np.triu(np.ones((3, 3), bool), 1)] = -np.inf
w = np.exp(s - s.max(axis=1, keepdims=True))
w /= w.sum(axis=1, keepdims=True)
for o, wr in zip(w @ v, w):
    print(*["%.17g" % x for x in list(o) + list(wr)])
EOF

# compares the program's "out a b   weights x y z" lines with the oracle;
# the program prints 4 decimals, so the bound is half of 1e-4 plus fp32 error
check_hello() {
    "$py" - "$1" "$tmp/expected.txt" <<'EOF'
import sys
got = [l.split() for l in open(sys.argv[1]) if l.strip()]
exp = [[float(x) for x in l.split()] for l in open(sys.argv[2])]
assert len(got) == 3, "expected 3 lines, got %d" % len(got)
for g, e in zip(got, exp):
    assert g[0] == "out" and g[3] == "weights", g
    vals = [float(x) for x in g[1:3] + g[4:7]]
    err = max(abs(a - b) for a, b in zip(vals, e))
    assert err <= 5.1e-5, "hello_attn %s vs fp64 %s (error %.2e)" % (vals, e, err)
EOF
}

cd "$work"
export PKG_CONFIG_PATH=$P/lib/pkgconfig
# shellcheck disable=SC2046  # pkg-config's output is a list of words
"$cc" -Wall -Wextra -Werror -o hello "$src/examples/hello_attn.c" $(pkg-config --cflags --libs attn) \
    || fail "hello_attn.c does not build with pkg-config --cflags --libs attn"
./hello > hello.txt || fail "./hello exited $?"
check_hello hello.txt || fail "hello (shared libattn) output is wrong"
ldd ./hello | grep -F "$soname => $P/lib/$soname" >/dev/null || { ldd ./hello; fail "hello does not load P's libattn.so"; }
# shellcheck disable=SC2046
"$cc" -Wall -Wextra -Werror -o hello_static "$src/examples/hello_attn.c" $(pkg-config --cflags attn) \
    "$P/lib/libattn.a" $(pkg-config --libs openblas) -fopenmp -lm || fail "hello_attn.c does not link P/lib/libattn.a"
./hello_static > hello_static.txt || fail "./hello_static exited $?"
check_hello hello_static.txt || fail "hello (static libattn) output is wrong"
unset PKG_CONFIG_PATH
echo "ok: C example via pkg-config (shared) and libattn.a"

if [ "$have_molgen" = 1 ]; then
    [ -x "$P/bin/molgen" ] || fail "not installed: P/bin/molgen"
    got=$("$P/bin/molgen" --version) || fail "molgen --version exited $?"
    [ "$got" = "molgen (libattn $version)" ] || fail "molgen --version printed '$got', expected 'molgen (libattn $version)'"
    rpath=$(readelf -d "$P/bin/molgen" | grep -E 'R(UN)?PATH' || true)
    case "$rpath" in
        *"$build"* | *"$src"*) fail "P/bin/molgen's RPATH points into the build or source tree: $rpath" ;;
    esac
    cp "$src/models/molgen-moses.safetensors" model.safetensors
    ATTN_NUM_THREADS=1 "$P/bin/molgen" sample --model model.safetensors -n 16 --seed 5 \
        --out samples.smi > sample.log 2>&1 || { cat sample.log; fail "P/bin/molgen sample exited non-zero"; }
    n=$(grep -c . samples.smi || true)
    [ "$n" = 16 ] || fail "P/bin/molgen sample wrote $n non-empty lines, expected 16"
    echo "ok: P/bin/molgen --version and sample from $work"
fi

site=$(dirname "$(dirname "$(find "$P" -path '*/attn/__init__.py' | head -n 1)")")
[ -f "$site/attn/_library_path.txt" ] || fail "no attn/_library_path.txt under $P"
PYTHONPATH=$site "$py" - "$site" "$P" <<'EOF' || fail "the installed attn package"
import os, sys
import numpy as np
site, prefix = sys.argv[1], sys.argv[2]
import attn
assert os.path.dirname(os.path.dirname(os.path.abspath(attn.__file__))) == site, attn.__file__
with open("/proc/self/maps") as f:
    loaded = {l.split()[-1] for l in f if "libattn" in l}
libdir = os.path.join(os.path.realpath(prefix), "lib") + "/"
assert loaded and all(os.path.realpath(p).startswith(libdir) for p in loaded), loaded

rng = np.random.default_rng(3)
q, k, v = (rng.standard_normal((2, 3, 5, 4)).astype(np.float32) for _ in range(3))
out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
s = q64 @ k64.transpose(0, 1, 3, 2) / 2.0
s[..., np.triu(np.ones((5, 5), bool), 1)] = -np.inf
w = np.exp(s - s.max(-1, keepdims=True))
w /= w.sum(-1, keepdims=True)
ref = w @ v64
err = np.abs(out - ref).max() / np.abs(ref).max()
assert err < 1e-5, "installed attn SDPA vs numpy fp64: relative error %.2e" % err
print("ok: import attn from %s (library %s), SDPA error %.1e" % (site, sorted(loaded)[0], err))
EOF

grep -qxF "version = \"$version\"" "$src/python/pyproject.toml" \
    || fail "python/pyproject.toml's version is not the project's $version"
for f in molgen/__init__.py molgen/metrics.py molgen/props.py molgen/moses_filters/__init__.py \
         molgen/moses_filters/mcf.csv molgen/chem_helper.py molgen/graph_ga.py \
         molgen/moses_filters/wehi_pains.csv molgen/scoring/__init__.py \
         molgen/scoring/pmo/qed.toml molgen/scoring/pmo/valsartan_smarts.toml; do
    [ -f "$site/$f" ] || fail "not installed: P's $f"
done
printf 'CCO\nC1CC\nCCO\nc1ccccc1O\n' > gen.smi
printf 'CCO\n' > train.smi
PYTHONPATH=$site "$py" - "$site" <<'EOF' || fail "the installed molgen package"
import json, os, subprocess, sys
site = sys.argv[1]
import molgen.metrics as m
import molgen.moses_filters as f
assert os.path.dirname(os.path.dirname(os.path.abspath(m.__file__))) == site, m.__file__
assert len(f.read_filter_smarts()) == 22 + 480, "MCF 22 + PAINS 480 patterns"
try:
    import rdkit  # noqa: F401
except ImportError:
    print("ok: import molgen.metrics from %s (RDKit absent: its run skipped)" % site)
    sys.exit(0)
p = subprocess.run([sys.executable, "-m", "molgen.metrics", "gen.smi", "--train", "train.smi",
                    "--json", "m.json", "--jobs", "1", "-q"], capture_output=True, text=True)
assert p.returncode == 0, p.stderr
r = json.load(open("m.json"))
# valid: CCO twice and phenol (C1CC's ring is not closed); distinct: CCO and
# phenol; novel (not in train.smi): phenol
assert (r["n_samples"], r["n_valid"]) == (4, 3), r
assert abs(r["validity"] - 3 / 4) < 1e-12 and abs(r["unique@1k"] - 2 / 3) < 1e-12, r
assert abs(r["novelty"] - 1 / 2) < 1e-12, r
print("ok: import molgen.metrics and python3 -m molgen.metrics from %s" % site)
# the installed scorer serves a PMO task: benzene's QED is RDKit's (0.4426)
p = subprocess.run([sys.executable, "-m", "molgen.scoring", "--task", "pmo/qed"],
                   input="c1ccccc1\nC1CC\n", capture_output=True, text=True)
assert p.returncode == 0, p.stderr
lines = p.stdout.splitlines()
from rdkit import Chem
from rdkit.Chem import QED
want = QED.qed(Chem.MolFromSmiles("c1ccccc1"))
assert len(lines) == 2 and abs(float(lines[0].split("\t")[0]) - want) < 1e-6, lines
assert lines[1].split("\t")[0] == "nan", lines
print("ok: python3 -m molgen.scoring --task pmo/qed from %s" % site)
EOF
echo "install test passed (prefix $P)"
