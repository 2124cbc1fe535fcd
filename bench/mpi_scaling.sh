#!/usr/bin/env bash
# Data-parallel scaling of `molgen train` on one machine (issue 17), measured
# side by side: ROUNDS interleaved rounds of
#   1r1t  1 process, 1 OpenMP thread
#   2r1t  mpirun -np 2, 1 thread per rank   (the same global batch, split)
#   1r2t  1 process, 2 OpenMP threads
# each a STEPS-step run of the default model (or MODEL_ARGS) on DATA; prints
# every run's tokens/s (timed steps: the job's target tokens per second) and
# communication ms/step (the ranks' collectives, waits included), then the
# medians and the speed-ups over 1r1t.
# Then the all-reduce alone (bench/mpi_allreduce.c) of the model's gradient
# size. MPIRUN_ARGS (default none) go to mpirun, e.g. "--mca
# mpi_yield_when_idle 1" (a waiting rank yields its core: faster all-reduces
# alone on a loaded machine, slower training there; README, "Scaling").
# Usage: bench/mpi_scaling.sh [BUILD_DIR]   (default build; env ROUNDS=5
#   STEPS=60 BATCH=32 DATA=data/moses_20k.smi MODEL_ARGS="" MPIRUN_ARGS=...)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
molgen=$build/molgen/molgen
rounds=${ROUNDS:-5}
steps=${STEPS:-60}
batch=${BATCH:-32}
data=${DATA:-data/moses_20k.smi}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
unset ATTN_NUM_THREADS
[ -x "$molgen" ] || { echo "mpi_scaling: no $molgen (build first)" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "mpi_scaling: no mpirun (apt-get install openmpi-bin)" >&2; exit 2; }
# shellcheck disable=SC2206
mpirun_args=(${MPIRUN_ARGS:-})
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck disable=SC2206
common=(train --data "$data" --steps "$steps" --batch-size "$batch" --val-every 0 --val-max 64
        --ckpt-every 0 --no-progress --quiet --seed 1 ${MODEL_ARGS:-})
run() { # name -> "tokens/s comm_ms"
    local name=$1 out=$tmp/$1.st json
    case $name in
        1r1t) json=$("$molgen" "${common[@]}" --threads 1 --out "$out") ;;
        2r1t) json=$(mpirun --oversubscribe --allow-run-as-root -np 2 "${mpirun_args[@]}" \
                         "$molgen" "${common[@]}" --threads 1 --out "$out") ;;
        1r2t) json=$("$molgen" "${common[@]}" --threads 2 --out "$out") ;;
    esac
    /usr/bin/python3 -c 'import json,sys; j=json.loads(sys.argv[1]); print(j["tokens_per_sec"], j.get("comm_ms_per_step", 0))' "$json"
}
configs=(1r1t 2r1t 1r2t)
echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $rounds rounds of $steps steps, batch $batch"
for ((i = 1; i <= rounds; i++)); do
    for c in "${configs[@]}"; do
        r=$(run "$c")
        echo "$c $r" >> "$tmp/results"
        echo "round $i $c: $r (tok/s, comm ms/step)"
    done
done
/usr/bin/python3 - "$tmp/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for c in ("1r1t", "2r1t", "1r2t"):
    tok = [float(r[1]) for r in rows if r[0] == c]
    comm = [float(r[2]) for r in rows if r[0] == c]
    med[c] = statistics.median(tok)
    print("%s: median %.0f tok/s (min %.0f, max %.0f), comm %.2f ms/step" % (
        c, med[c], min(tok), max(tok), statistics.median(comm)))
print("2 ranks x 1 thread / 1 x 1: %.2fx; 1 rank x 2 threads / 1 x 1: %.2fx; 2r1t / 1r2t: %.2fx" % (
    med["2r1t"] / med["1r1t"], med["1r2t"] / med["1r1t"], med["2r1t"] / med["1r2t"]))
EOF
# the gradient's size: the parameters of the last 1r1t checkpoint
n=$(/usr/bin/python3 -c '
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
print(sum((v["data_offsets"][1] - v["data_offsets"][0]) // 4 for k, v in h.items()
          if k != "__metadata__" and not k.startswith("optim.")))' "$tmp/1r1t.st")
mpicc -O2 bench/mpi_allreduce.c -o "$tmp/allreduce"
mpirun --oversubscribe --allow-run-as-root -np 2 "${mpirun_args[@]}" "$tmp/allreduce" "$n" 50
