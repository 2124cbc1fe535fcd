#!/usr/bin/env bash
# molgen's fine-tuning demonstration (README, "Fine-tuning"): 400 coumarins
# (SMARTS O=c1ccc2ccccc2o1) picked from moses_176k.smi by RDKit, the shipped
# model fine-tuned on them three ways (40 steps; 200 steps; 200 steps with
# the embeddings and blocks 0-3 frozen), 2,000 samples before and after each,
# their coumarin share and MOSES metrics, and the NLL per token (molgen
# score) of the other 314 coumarins and of 300 general molecules.
# The three runs of the README keep their last step (--keep last --patience
# 0: what --init did before it kept the best validation); a fourth,
# coumarin_defaults, runs molgen's fine-tuning defaults (lr, validation
# split, --keep best, --patience) for up to 200 steps. For every model,
# tools/finetune_eval.py eval gives the held-out mean NLL (the 314), the
# share of valid samples that copy one of the 400, novelty against them and
# the coumarin share: DIR/eval_NAME.json (STAGE=eval skips to that part).
#   tools/finetune_demo.sh [OUT_DIR]     (default out/finetune; ~35 min on
#                                         the shared 2-core machine)
set -euo pipefail
cd "$(dirname "$0")/.."
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
M=${MOLGEN:-build/molgen/molgen}
PY=${PYTHON:-/usr/bin/python3}
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"  # the molgen package
D=${1:-out/finetune}
DATA=../shared/data
MOTIF='O=c1ccc2ccccc2o1'
mkdir -p "$D"
if [ "${STAGE:-all}" != eval ]; then
$PY -m molgen.motif_set pick --data $DATA/moses_176k.smi --smarts "$MOTIF" --n 400 --seed 1 \
    --out "$D/coumarins.smi"
$PY -m molgen.motif_set pick --data $DATA/moses_176k.smi --smarts "$MOTIF" --n 1000000 \
    --out "$D/all_coumarins.smi"
grep -vxFf "$D/coumarins.smi" "$D/all_coumarins.smi" > "$D/other_coumarins.smi"
head -300 $DATA/moses_train5k.smi > "$D/general300.smi"
ft() { # name, extra options
    $M train --init models/molgen-moses.safetensors --data "$D/coumarins.smi" --lr 2e-4 \
        --warmup 20 --val-frac 0.1 --time-limit 300 --no-progress --keep last --patience 0 \
        --out "$D/$1.safetensors" "${@:2}"
}
ft coumarin40 --steps 40 --val-every 10
ft coumarin --steps 200 --val-every 25
ft coumarin_f4 --steps 200 --val-every 25 --freeze 4
$M train --init models/molgen-moses.safetensors --data "$D/coumarins.smi" --steps 200 \
    --no-progress --out "$D/coumarin_defaults.safetensors" > "$D/coumarin_defaults.json"
$M sample --model models/molgen-moses.safetensors -n 2000 --seed 7 --out "$D/before.smi"
for m in coumarin40 coumarin coumarin_f4; do
    $M sample --model "$D/$m.safetensors" -n 2000 --seed 7 --out "$D/samples_$m.smi"
done
for m in models/molgen-moses.safetensors "$D"/coumarin40.safetensors "$D"/coumarin.safetensors \
         "$D"/coumarin_f4.safetensors; do
    b=$(basename "$m" .safetensors)
    $M score --model "$m" --smiles "$D/other_coumarins.smi" --out "$D/score_$b.csv"
    $M score --model "$m" --smiles "$D/general300.smi" --out "$D/gen_$b.csv"
done
for s in before samples_coumarin40 samples_coumarin samples_coumarin_f4; do
    $PY -m molgen.motif_set share "$D/$s.smi" --smarts "$MOTIF"
    $PY -m molgen.metrics "$D/$s.smi" --train $DATA/moses_176k.smi --ref $DATA/moses_train5k.smi \
        --json "$D/metrics_$s.json" --jobs 2 -q > "$D/metrics_$s.txt"
done
fi
for m in models/molgen-moses.safetensors "$D"/coumarin40.safetensors "$D"/coumarin.safetensors \
         "$D"/coumarin_f4.safetensors "$D"/coumarin_defaults.safetensors; do
    b=$(basename "$m" .safetensors)
    MOLGEN=$M $PY tools/finetune_eval.py eval --model "$m" --focus "$D/coumarins.smi" \
        --heldout "$D/other_coumarins.smi" --smarts "$MOTIF" -n 2000 --workdir "$D" \
        > "$D/eval_$b.json"
done
