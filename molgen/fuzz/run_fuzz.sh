#!/usr/bin/env bash
# Build molgen's libFuzzer targets with clang (ASan + UBSan) and run each for
# SECONDS, one after the other; fail on any crash, leak, sanitizer report,
# broken invariant, hang (> 10 s on one input) or out-of-memory (> 2 GB).
#
#   molgen/fuzz/run_fuzz.sh [SECONDS] [TARGET...]
#     SECONDS  per target (default 10; 0 = only replay the seed corpus)
#     TARGET   safetensors json tokenizer data smiles_check (default: all)
#   molgen/fuzz/run_fuzz.sh 600      the longer run: 10 minutes per target
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), CC (default clang).
# Each target starts from its committed seeds (molgen/fuzz/corpus/TARGET) plus
# what earlier runs in this build directory found (BUILD/fuzz-work/TARGET);
# the seeds are never written. Logs: BUILD/fuzz-logs/TARGET.log; a failing
# input is saved as BUILD/fuzz-artifacts/TARGET-crash-... (replay it with
# BUILD/molgen/fuzz/fuzz_TARGET FILE).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
secs=${1:-10}
[ $# -gt 0 ] && shift
case $secs in
  '' | *[!0-9]*) echo "run_fuzz.sh: SECONDS must be a non-negative integer, not '$secs'" >&2; exit 2 ;;
esac
all=(safetensors json tokenizer data smiles_check)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
for t in "${targets[@]}"; do
  [[ " ${all[*]} " == *" $t "* ]] || { echo "run_fuzz.sh: unknown target '$t' (${all[*]})" >&2; exit 2; }
done
bdir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
export CC=${CC:-clang}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

mkdir -p "$bdir"
if ! cmake -S "$root" -B "$bdir" -DCMAKE_BUILD_TYPE=Debug -DATTN_FUZZ=ON -DATTN_BUILD_MOLGEN=OFF \
    >"$bdir/fuzz-configure.log" 2>&1; then
  cat "$bdir/fuzz-configure.log" >&2
  echo "run_fuzz.sh: configure failed (needs clang with libFuzzer: Debian clang, libclang-rt-dev)" >&2
  exit 1
fi
if ! cmake --build "$bdir" -j 2 --target "${targets[@]/#/fuzz_}" >"$bdir/fuzz-build.log" 2>&1; then
  cat "$bdir/fuzz-build.log" >&2
  echo "run_fuzz.sh: build failed" >&2
  exit 1
fi

mkdir -p "$bdir/fuzz-logs" "$bdir/fuzz-artifacts"
failed=()
printf '%-14s %6s %10s %8s %6s %6s %14s %7s\n' target seconds execs exec/s cov ft corpus rss_mb
for t in "${targets[@]}"; do
  case $t in
    safetensors | json) dict=json.dict; maxlen=65536 ;;
    data) dict=data.dict; maxlen=8192 ;;
    *) dict=smiles.dict; maxlen=4096 ;;
  esac
  work=$bdir/fuzz-work/$t
  log=$bdir/fuzz-logs/$t.log
  mkdir -p "$work"
  if [ "$secs" -eq 0 ]; then
    budget=(-runs=0)
  else
    budget=(-max_total_time="$secs")
  fi
  start=$(date +%s)
  "$bdir/molgen/fuzz/fuzz_$t" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=$maxlen \
      -dict="$here/$dict" -artifact_prefix="$bdir/fuzz-artifacts/$t-" -print_final_stats=1 \
      "$work" "$here/corpus/$t" >"$log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if [ $rc -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|fuzz invariant failed' "$log"; then
    failed+=("$t")
  fi
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corp=$(sed -nE 's/.* corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$last")
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log")
  eps=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log")
  rss=$(sed -nE 's/^stat::peak_rss_mb: *([0-9]+)/\1/p' "$log")
  printf '%-14s %6s %10s %8s %6s %6s %14s %7s%s\n' "$t" "$took" "${execs:-?}" "${eps:-?}" "${cov:-?}" \
      "${ft:-?}" "${corp:-?}" "${rss:-?}" "$([ $rc -ne 0 ] && echo "  FAILED (rc $rc)")"
done

if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo "---- fuzz_$t: tail of $bdir/fuzz-logs/$t.log" >&2
    tail -n 40 "$bdir/fuzz-logs/$t.log" >&2
  done
  echo "run_fuzz.sh: FAILED: ${failed[*]} (inputs in $bdir/fuzz-artifacts/)" >&2
  exit 1
fi
echo "run_fuzz.sh: ${#targets[@]} targets, ${secs} s each: no crash, leak, sanitizer report or broken invariant"
