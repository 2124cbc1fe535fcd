#!/bin/bash
# libattn.so exports exactly the functions attn.h declares ATTN_API: the
# dynamic symbol table's defined symbols (nm -D --defined-only) against the
# declarations of the preprocessed header (CC -E: no comments, ATTN_API
# expanded) that carry visibility("default"); a declaration's name is the
# identifier before its first '('.
#   exported_symbols.sh LIBATTN_SO ATTN_H CC
set -euo pipefail
lib=$1 header=$2 cc=$3
command -v nm >/dev/null || { echo "exported_symbols: nm not found (binutils)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Header: one declaration per line, keep the exported ones.
"$cc" -E -P -x c "$header" | tr '\n' ' ' | sed 's/;/;\n/g' |
    grep -F 'visibility("default")' | sed 's/__attribute__((visibility("default")))//; s/(.*//' |
    grep -o '[A-Za-z_][A-Za-z_0-9]*[[:space:]]*$' | sed 's/[[:space:]]*$//' |
    sort -u >"$tmp/header"
# Library: defined dynamic symbols, without versions.
nm -D --defined-only "$lib" | awk '{print $NF}' | sed 's/@.*//' | sort -u >"$tmp/lib"

n=$(wc -l <"$tmp/header")
if [ "$n" -lt 10 ]; then
    echo "exported_symbols: only $n ATTN_API declarations found in $header (parser broken?)"
    exit 1
fi
if ! diff -u "$tmp/header" "$tmp/lib" >"$tmp/diff"; then
    echo "exported_symbols: $lib exports other symbols than $header declares"
    echo "(- declared but not exported, + exported but not declared)"
    cat "$tmp/diff"
    exit 1
fi
echo "exported_symbols: $lib exports exactly the $n functions of $header"
