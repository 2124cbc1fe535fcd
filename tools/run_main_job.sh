#!/usr/bin/env bash
# molgen's main job (`make run`):
#   1. train a small model on the default data for a bounded time, with the
#      progress display, to show that training works;
#   2. sample 1,000 molecules from the shipped model and from the fresh one
#      and print their metrics side by side (RDKit via molgen.metrics, in
#      python/molgen, when it imports, else molgen's SMILES grammar check);
#   3. draw the attention maps of a drug-like molecule (shipped model, else
#      the fresh one) and print the per-head table.
# Everything goes under out/main_job/ (gitignored); every path is printed.
#
# Environment: PYTHON (default /usr/bin/python3), MOLGEN (the binary, default
# build/molgen/molgen), TRAIN_SECONDS (default 120), MAIN_JOB_N (molecules per
# model, default 1000), MAIN_JOB_OUT (default out/main_job), MAIN_JOB_SHIPPED
# (default models/molgen-moses.safetensors), MAIN_JOB_MAX_REF (2000),
# ATTN_NUM_THREADS, OMP_WAIT_POLICY (default PASSIVE: idle OpenMP threads sleep;
# see README, "OMP_WAIT_POLICY").
set -euo pipefail
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
cd "$(dirname "$0")/.."
# the Python package molgen (python/molgen) of this tree, for `-m molgen.metrics`
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"

PYTHON=${PYTHON:-/usr/bin/python3}
MOLGEN=${MOLGEN:-build/molgen/molgen}
TRAIN_SECONDS=${TRAIN_SECONDS:-120}
N=${MAIN_JOB_N:-1000}
OUT=${MAIN_JOB_OUT:-out/main_job}
DATA=data/moses_20k.smi
SHIPPED=${MAIN_JOB_SHIPPED:-models/molgen-moses.safetensors}
ZINC=${MAIN_JOB_ZINC:-models/molgen-zinc.safetensors}
# the ZINC prior's samples are measured against ZINC250k (a 24k subset, for
# time) when ../shared/data has it
ZINC_REF=../shared/data/zinc250k_24k.smi
FRESH=$OUT/fresh.safetensors
SEED=2024
MAX_REF=${MAIN_JOB_MAX_REF:-2000}   # reference molecules for SNN/Frag/Scaf/W1
# a drug-like molecule of the MOSES data (an acetanilide sulfonamide):
# a ring bond (c1 ... c1) that spans a branch containing another ring
MOLECULE='CC(=O)Nc1ccc(S(=O)(=O)NC2CCCCC2)cc1'

die() { echo "main job: $*" >&2; exit 1; }
[ -x "$MOLGEN" ] || die "$MOLGEN not found: run 'make build' first"
[ -f "$DATA" ] || die "$DATA not found"
mkdir -p "$OUT"

have_shipped=0
if [ -f "$SHIPPED" ]; then have_shipped=1; fi

# RDKit is optional: without it the metrics are molgen's grammar check only
# (said once, at the metrics step, with the package that gives the rest)
have_rdkit=0
no_rdkit=''
if ! "$PYTHON" -c '' >/dev/null 2>&1; then
    no_rdkit="$PYTHON not found: metrics use molgen's grammar check; apt-get install python3 python3-numpy python3-rdkit for the full table"
elif ! "$PYTHON" -c 'import numpy' >/dev/null 2>&1; then
    no_rdkit="numpy not found in $PYTHON: metrics use molgen's grammar check; apt-get install python3-numpy python3-rdkit for the full table"
elif ! "$PYTHON" -c 'import rdkit' >/dev/null 2>&1; then
    no_rdkit="RDKit not found in $PYTHON: metrics use molgen's grammar check; apt-get install python3-rdkit for the full table"
else
    have_rdkit=1
fi

echo "== 1/3  training a small model on $DATA for ${TRAIN_SECONDS} s (default architecture)"
"$MOLGEN" train --data "$DATA" --time-limit "$TRAIN_SECONDS" --seed 1 --val-every 100 \
    --out "$FRESH" > "$OUT/train_summary.json"
echo "checkpoint: $FRESH"
echo "training summary (JSON): $OUT/train_summary.json"
echo

echo "== 2/3  sampling $N molecules from each model (seed $SEED, temperature 1)"
models=()
names=()
if [ "$have_shipped" = 1 ]; then
    models+=("$SHIPPED"); names+=(shipped)
else
    echo "note: the shipped model $SHIPPED is absent; sampling only the fresh model"
fi
if [ -f "$ZINC" ]; then models+=("$ZINC"); names+=(zinc); fi
models+=("$FRESH"); names+=(fresh)
for i in "${!models[@]}"; do
    name=${names[$i]}
    echo "-- $name model: ${models[$i]}"
    "$MOLGEN" sample --model "${models[$i]}" -n "$N" --seed "$SEED" \
        --out "$OUT/samples_$name.smi" 2> >(tee "$OUT/sample_$name.log" >&2)
done
wait

# The training set each model saw (its checkpoint's "train" metadata), for
# novelty; falls back to the default data.
train_data_of() {
    "$PYTHON" - "$1" "$DATA" <<'EOF' 2>/dev/null || echo "$DATA"
import json, os, struct, sys
path, fallback = sys.argv[1], sys.argv[2]
with open(path, 'rb') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    meta = json.loads(f.read(n)).get('__metadata__', {})
data = json.loads(meta.get('train', '{}')).get('data') if 'train' in meta else None
print(data if data and os.path.isfile(data) else fallback)
EOF
}

REF=$DATA
if [ -f ../shared/data/moses_train5k.smi ]; then REF=../shared/data/moses_train5k.smi; fi
echo
if [ "$have_rdkit" = 1 ]; then
    echo "metrics (RDKit, molgen.metrics; reference: $MAX_REF molecules of $REF; novelty"
    echo "against each model's training data):"
    jsons=()
    # the reference's Filters (the table's reference column, from the first
    # model's run) is computed once: it does not depend on the samples
    ref_filters=()
    for name in "${names[@]}"; do
        model=$FRESH ref=$REF
        [ "$name" = shipped ] && model=$SHIPPED
        [ "$name" = zinc ] && model=$ZINC
        train=$(train_data_of "$model")
        if [ "$name" = zinc ]; then
            # ZINC250k (240k) takes minutes to canonicalise: its 24k subset
            if [ -f "$ZINC_REF" ]; then train=$ZINC_REF ref=$ZINC_REF; fi
        fi
        echo "  $name: novelty against $train, reference $ref"
        "$PYTHON" -m molgen.metrics "$OUT/samples_$name.smi" --train "$train" --ref "$ref" \
            --max-ref "$MAX_REF" "${ref_filters[@]}" --json "$OUT/metrics_$name.json" -q \
            > "$OUT/metrics_$name.txt"
        jsons+=("$name=$OUT/metrics_$name.json=$OUT/samples_$name.smi")
        ref_filters=(--no-ref-filters)
    done
    "$PYTHON" - "${jsons[@]}" <<'EOF'
import json, sys
cols = []
from molgen.guacamol import stereo_charge
for arg in sys.argv[1:]:
    name, path, samples = arg.split('=', 2)
    with open(path) as f:
        d = json.load(f)
    with open(samples) as f:
        sc = stereo_charge([l.split()[0] if l.split() else '' for l in f])['samples']
    d['stereo share'], d['charged share'] = sc['stereo_share'], sc['charge_share']
    cols.append((name, d))

def get(d, key):
    for part in key.split('.'):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d

rows = [('samples', 'n_samples'), ('valid', 'n_valid'), ('validity', 'validity'),
        ('unique@1k', 'unique@1k'), ('unique@10k', 'unique@10k'), ('novelty', 'novelty'),
        ('Filters', 'Filters'), ('IntDiv1', 'IntDiv1'), ('IntDiv2', 'IntDiv2'), ('SNN', 'SNN'), ('Frag', 'Frag'),
        ('Scaf', 'Scaf'), ('W1 logP', 'wasserstein.logP'), ('W1 SA', 'wasserstein.SA'),
        ('W1 QED', 'wasserstein.QED'), ('W1 weight', 'wasserstein.weight'),
        ('mean logP', 'property_means.samples.logP'), ('mean SA', 'property_means.samples.SA'),
        ('mean QED', 'property_means.samples.QED'),
        ('mean weight', 'property_means.samples.weight'),
        ('stereo share', 'stereo share'), ('charged share', 'charged share')]
names = [n for n, _ in cols] + ['reference']
print('%-14s' % 'metric' + ''.join('%12s' % n for n in names))
for label, key in rows:
    vals = [get(d, key) for _, d in cols]
    ref = get(cols[0][1], key.replace('.samples.', '.reference.')) if '.samples.' in key else None
    if key == 'Filters':
        ref = get(cols[0][1], 'Filters_ref')
    line = '%-14s' % label
    k = {'unique@1k': 1000, 'unique@10k': 10000}.get(label)
    for i, v in enumerate(vals + [ref]):
        short = k is not None and i < len(cols) and (get(cols[i][1], 'n_valid') or 0) < k
        if v is None:
            line += '%12s' % '-'
        elif isinstance(v, bool) or isinstance(v, int):
            line += '%12d' % v
        elif short:
            line += '%11.4f*' % v
        else:
            line += '%12.4f' % v
    print(line)
print('(MOSES definitions, see python/molgen/metrics.py; "-": not defined for these samples,'
      ' e.g. Scaf without ring scaffolds; "*": fewer valid samples than k, so over all of them;'
      ' stereo / charged share: valid samples with a stereo mark / a charged atom; reference:'
      ' the first model\'s reference set)')
for name, why in sorted((get(cols[0][1], 'not_computed') or {}).items()):
    print('%s: not computed: %s' % (name, why))
EOF
    for name in "${names[@]}"; do
        echo "metrics of $name: $OUT/metrics_$name.txt, $OUT/metrics_$name.json"
    done
else
    echo "$no_rdkit"
    printf '%-10s %s\n' model "syntax check (molgen sample)"
    for name in "${names[@]}"; do
        printf '%-10s %s\n' "$name" "$(grep -m1 '^syntax-valid' "$OUT/sample_$name.log" || echo '?')"
    done
fi
for name in "${names[@]}"; do
    echo "samples of $name: $OUT/samples_$name.smi"
done
echo

echo "== 3/3  attention maps of $MOLECULE"
att_model=$FRESH
att_name=fresh
if [ "$have_shipped" = 1 ]; then att_model=$SHIPPED; att_name=shipped; fi
echo "model: $att_model ($att_name)"
"$MOLGEN" attention --model "$att_model" --smiles "$MOLECULE" --out "$OUT/attention_$att_name"
echo
echo "main job done; outputs under $OUT/"
