#!/bin/sh
# Build and run bench/sgemm_candidates.c against the build's libattn.a:
#   bench/sgemm_candidates.sh [SIZE [THREADS [ROUNDS [REPS]]]]
# (after `make build`; BLIS and oneDNN are used when libblis4 / libdnnl2
# are installed). OPENBLAS_CORETYPE is kept as set (Haswell if unset, as the
# Makefile does); OPENBLAS_CORETYPE=SkylakeX shows OpenBLAS's AVX-512 kernels.
set -e
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/build/sgemm_candidates
cc -O2 -std=c11 -fopenmp -I"$root/include" -I"$root/src" -I"$root/common" "$root/bench/sgemm_candidates.c" \
  "$root/build/libattn.a" $(pkg-config --libs openblas) -ldl -lm -o "$out"
OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} "$out" "$@"
