#!/usr/bin/env bash
# Source coverage that the fuzz corpora reach: builds each harness with
# clang's source-based coverage (no sanitizers), replays the seeds plus what
# run_fuzz.sh found (BUILD/fuzz-work/TARGET), and prints llvm-cov's line and
# branch coverage of the molgen code each target is aimed at.
#
#   molgen/fuzz/coverage.sh [TARGET...]      (after molgen/fuzz/run_fuzz.sh)
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), CC (default clang).
# Per-line detail: llvm-cov show BUILD/fuzz-cov/cov_TARGET
#   -instr-profile=BUILD/fuzz-cov/TARGET.profdata molgen/FILE.c
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bdir=${FUZZ_BUILD_DIR:-$root/build-fuzz}
cc=${CC:-clang}
ver=$("$cc" --version | sed -nE 's/.*clang version ([0-9]+).*/\1/p' | head -1)
profdata=$(command -v "llvm-profdata-$ver" || command -v llvm-profdata)
llvmcov=$(command -v "llvm-cov-$ver" || command -v llvm-cov)
out=$bdir/fuzz-cov
mkdir -p "$out"
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors json tokenizer data smiles_check)
# the same sources as molgen/fuzz/CMakeLists.txt
srcs=()
for f in base/safetensors base/safetensors_write base/json chem/tokenizer chem/data \
         chem/smiles_check base/errors base/util; do
  srcs+=("$root/molgen/$f.c")
done
libs=(-lz $(pkg-config --libs jansson 2>/dev/null))
# The functions a target is aimed at (regex over llvm-cov's function names;
# static ones are "file.c:name"): for fuzz_safetensors everything in the
# reader but the functions that do file I/O (mg_st_load, the temp-file
# cleanup), which a buffer cannot reach. fuzz_json's file is molgen's layer
# over jansson; jansson itself is the system library, not instrumented.
printf '%-14s %-20s %-22s %18s %18s\n' target file scope lines branches
for t in "${targets[@]}"; do
  incl=. excl='^$' scope='whole file'
  case $t in
    safetensors) file=base/safetensors.c excl='^mg_st_(load|remove_stale_temps)$' scope='reader (no file I/O)' ;;
    json) file=base/json.c ;;
    *) file=chem/$t.c ;;
  esac
  "$cc" -O1 -g -fprofile-instr-generate -fcoverage-mapping -fsanitize=fuzzer -I"$root/molgen" \
      "$here/fuzz_$t.c" "${srcs[@]}" "${libs[@]}" -o "$out/cov_$t"
  mkdir -p "$bdir/fuzz-work/$t"
  rm -f "$out/$t".profraw*
  LLVM_PROFILE_FILE="$out/$t.profraw" "$out/cov_$t" -runs=0 "$bdir/fuzz-work/$t" "$here/corpus/$t" \
      >"$out/$t.log" 2>&1
  "$profdata" merge -sparse "$out/$t.profraw" -o "$out/$t.profdata"
  # rows: Name Regions Miss Cover Lines Miss Cover Branches Miss Cover
  "$llvmcov" report -show-functions "$out/cov_$t" -instr-profile="$out/$t.profdata" "$root/molgen/$file" |
      awk -v t="$t" -v f="$file" -v s="$scope" -v incl="$incl" -v excl="$excl" '
        NF == 10 && $1 != "Name" && $1 != "TOTAL" && $1 ~ incl && $1 !~ excl {
          l += $5; lm += $6; b += $8; bm += $9 }
        END { printf "%-14s %-20s %-22s %6.1f%% of %-6d %6.1f%% of %-6d\n", t, f, s,
                     l ? 100 * (l - lm) / l : 0, l, b ? 100 * (b - bm) / b : 0, b }'
done
