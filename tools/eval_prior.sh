#!/usr/bin/env bash
# Evaluates a prior trained on a SMILES file (docs/molgen.md, "The ZINC prior"):
#   1. its training / validation split, written out (molgen.split: the same
#      --val-frac and --seed as the training run);
#   2. N samples at the defaults (temperature 1, unconstrained), MOSES metrics
#      against the validation split (molecules the model never trained on),
#      novelty against the training split, GuacaMol's scores, stereo and
#      charge shares beside the data's;
#   3. the same with --constrain valence;
#   4. memorisation: mean NLL per token of validation molecules against as
#      many training molecules;
#   5. which of data/drugs30.smi and of the first 300 validation molecules the
#      model reads (molgen score's statuses).
# Usage: tools/eval_prior.sh MODEL DATA OUTDIR [N] [VAL_FRAC] [SEED]
# Environment: MOLGEN (default build/molgen/molgen), PYTHON (/usr/bin/python3),
# THREADS (default 2), SAMPLE_SEED (default 7), N_VALENCE (samples with
# --constrain valence, default N).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=PASSIVE
[ $# -ge 3 ] || { echo "usage: tools/eval_prior.sh MODEL DATA OUTDIR [N] [VAL_FRAC] [SEED]" >&2; exit 2; }
MODEL=$1 DATA=$2 OUT=$3 N=${4:-30000} VF=${5:-0.05} SEED=${6:-1}
MOLGEN=${MOLGEN:-build/molgen/molgen} PYTHON=${PYTHON:-/usr/bin/python3}
T=${THREADS:-2} SS=${SAMPLE_SEED:-7}
mkdir -p "$OUT"
run() { echo "\$ $*" >&2; "$@"; }

run "$PYTHON" -m molgen.split "$DATA" --val-frac "$VF" --seed "$SEED" \
    --train "$OUT/train.smi" --val "$OUT/val.smi"
for mode in none valence; do
    n=$N
    [ "$mode" = valence ] && n=${N_VALENCE:-$N}
    run "$MOLGEN" sample --model "$MODEL" -n "$n" --seed "$SS" --constrain "$mode" --threads "$T" \
        --out "$OUT/samples_$mode.smi"
    run "$PYTHON" -m molgen.metrics "$OUT/samples_$mode.smi" --train "$OUT/train.smi" \
        --ref "$OUT/val.smi" --guacamol --jobs "$T" -q --json "$OUT/metrics_$mode.json" \
        | tee "$OUT/metrics_$mode.txt"
done

# memorisation: validation molecules against as many training molecules
nval=$(wc -l < "$OUT/val.smi")
head -n "$nval" "$OUT/train.smi" > "$OUT/train_head.smi"
for part in val train_head; do
    run "$MOLGEN" score --model "$MODEL" --smiles "$OUT/$part.smi" --threads "$T" --quiet \
        --out "$OUT/score_$part.csv"
done
"$PYTHON" - "$OUT" <<'EOF'
import csv, sys
out = sys.argv[1]
res = {}
for part in ('val', 'train_head'):
    nll = tok = n = 0
    with open('%s/score_%s.csv' % (out, part)) as f:
        for r in csv.DictReader(f):
            if r['status'] == 'ok':
                nll += float(r['nll']); tok += int(r['tokens']); n += 1
    res[part] = nll / tok
    print('%-10s %6d molecules read, mean NLL %.4f nats/token' % (part, n, nll / tok))
print('validation / training NLL per token: %.4f' % (res['val'] / res['train_head']))
EOF

head -n 300 "$OUT/val.smi" > "$OUT/val300.smi"
for f in data/drugs30.smi "$OUT/val300.smi"; do
    b=$(basename "$f" .smi)
    run "$MOLGEN" score --model "$MODEL" --smiles "$f" --threads "$T" --out "$OUT/score_$b.csv" \
        2> "$OUT/score_$b.log" || true
    echo "$f: $(cut -d, -f6- "$OUT/score_$b.csv" | tail -n +2 | cut -d, -f1 | sort | uniq -c | tr '\n' ' ')"
done
