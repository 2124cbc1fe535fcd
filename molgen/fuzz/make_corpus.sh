#!/usr/bin/env bash
# Writes the seed corpora of molgen's fuzz targets into molgen/fuzz/corpus/
# (what is committed there came from this script; regression inputs that
# fuzzing found are kept beside them as regress_*). Run from anywhere:
#   MOLGEN=build/molgen/molgen molgen/fuzz/make_corpus.sh
# (CORPUS_DIR=DIR writes elsewhere, e.g. to compare with the committed one).
# Sources:
#   - SMILES: lines of data/moses_20k.smi (by line number), plus hand-written
#     edge cases of the SMILES grammar (edge_*: charges, chirality, isotopes,
#     %nn ring labels, stereo bonds, fragments);
#   - safetensors: a tiny checkpoint written by `molgen train` itself (1 layer,
#     d_model 8, 2 steps on 64 MOSES molecules: weights, optimizer state,
#     config / vocab / optimizer / training metadata, CRC-32 table), the same
#     tensors without the CRC-32 table (as an older molgen wrote them), and one
#     tensor of each dtype incl. a scalar and an empty tensor (written here in
#     Python from the format's definition);
#   - JSON: that checkpoint's header and metadata values, and escapes /
#     numbers edge cases;
#   - data: byte 0 = the harness's option bits (see fuzz_data.c), then a .smi
#     or .csv file made of MOSES lines.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
molgen=$(realpath "${MOLGEN:-$root/build/molgen/molgen}")
py=${PYTHON:-/usr/bin/python3}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
[ -x "$molgen" ] || { echo "make_corpus.sh: no molgen binary at $molgen (build it, or set MOLGEN)" >&2; exit 1; }
c=${CORPUS_DIR:-$here/corpus}
smi=$root/data/moses_20k.smi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$c"/{smiles_check,tokenizer,data,safetensors,json}
rm -f "$c"/*/seed_*

line() { sed -n "${1}p" "$smi" | cut -f1 -d' ' | tr -d '\r\n'; }
moses_lines="1 3 4 6 9 16 18 20 36 45 51 56"
edges=(
  'C[C@@H](N)C(=O)O'     'C[N+](C)(C)C.[Cl-]'  '[13CH3]C(=O)[O-]'     'F/C=C/F'
  'C1CC2CCC%10CCC2C%10C1' 'c1ccc2[se]ccc2c1'    '[Fe+2].[O-]C(=O)C'     'O=N(=O)c1ccccc1'
  'CC(C)(C)[Si](C)(C)O'  '[C@TH1](F)(Cl)(Br)I' 'N#[N+][O-]'            '*C(=O)*'
)

for n in $moses_lines; do printf '%s' "$(line "$n")" > "$c/smiles_check/seed_moses_$n"; done
i=0; for e in "${edges[@]}"; do printf '%s' "$e" > "$c/smiles_check/seed_edge_$i"; i=$((i + 1)); done

for n in 1 9 20; do printf '%s' "$(line "$n")" > "$c/tokenizer/seed_moses_$n"; done
sed -n '100,119p' "$smi" | cut -f1 -d' ' > "$c/tokenizer/seed_moses_100-119"
printf '%s\n' "${edges[@]}" > "$c/tokenizer/seed_edges"

# the tiny checkpoint, written by molgen
head -64 "$smi" > "$tmp/d.smi"
(cd "$tmp" && "$molgen" train --data d.smi --out tiny.safetensors --layers 1 --d-model 8 --heads 2 \
    --steps 2 --batch-size 4 --val-frac 0.1 --threads 1 --no-guard --quiet > /dev/null)
cp "$tmp/tiny.safetensors" "$c/safetensors/seed_molgen_train.safetensors"

"$py" - "$tmp/tiny.safetensors" "$c" <<'EOF'
import json, struct, sys
src, c = sys.argv[1], sys.argv[2]

def read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]

def write(path, header, data):
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((8 - (8 + len(h)) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + data)

hdr, data = read(src)
meta = hdr['__metadata__']
open(c + '/json/seed_header.json', 'w').write(json.dumps(hdr, separators=(',', ':')))
for k in ('config', 'vocab', 'optim', 'train', 'crc32'):
    open(c + '/json/seed_meta_' + k + '.json', 'w').write(meta[k])
open(c + '/tokenizer/seed_vocab.json', 'w').write(meta['vocab'])

old = dict(hdr)
old['__metadata__'] = {k: v for k, v in meta.items() if k != 'crc32'}
write(c + '/safetensors/seed_molgen_nocrc.safetensors', old, data)

# one tensor of each dtype (little-endian, row-major), a scalar, an empty one
sizes = [('BOOL', 1), ('U8', 1), ('I8', 1), ('F8_E5M2', 1), ('F8_E4M3', 1), ('I16', 2),
         ('U16', 2), ('F16', 2), ('BF16', 2), ('I32', 4), ('U32', 4), ('F32', 4),
         ('F64', 8), ('I64', 8), ('U64', 8)]
h, buf = {'__metadata__': {'format': 'pt', 'note': 'caf\u00e9 \"q\" \\\\ \\n'}}, b''
for i, (dt, es) in enumerate(sorted(sizes, key=lambda s: -s[1])):
    shape = [[2, 3], [], [0, 4], [3], [1, 1, 2]][i % 5]
    n = 1
    for d in shape:
        n *= d
    h['t%d_%s' % (i, dt.lower())] = {'dtype': dt, 'shape': shape,
                                     'data_offsets': [len(buf), len(buf) + n * es]}
    buf += bytes((i * 7 + k) % 256 for k in range(n * es))
write(c + '/safetensors/seed_dtypes.safetensors', h, buf)
EOF

printf '%s' '{"a":[1,-0,0.5,-2.5e-7,1E+308,9223372036854775807,-9223372036854775808,18446744073709551616],"s":"\u00e9\ud83d\ude00\t\"\\\/","n":null,"t":true,"f":false,"o":{"":{}},"e":[]}' \
    > "$c/json/seed_edge.json"

# data: option byte, then the file
mk() { printf "\\x$1" > "$c/data/seed_$2"; cat >> "$c/data/seed_$2"; }
{ echo '# MOSES sample'; sed -n '1,12p' "$smi"; echo; } | mk 00 smi_built
sed -n '13,24p' "$smi" | mk 0a smi_fixed_T24
sed -n '25,36p' "$smi" | sed 's/$/\r/' | mk 20 smi_crlf_max12
{ echo 'id,smiles,score'; n=0; sed -n '37,46p' "$smi" | while read -r s; do n=$((n + 1)); echo "m$n,\"$s\",0.$n"; done; } | mk 01 csv_built
{ echo 'SMILES'; sed -n '47,54p' "$smi"; } | mk 43 csv_column_fixed
{ echo 'name smiles'; echo 'CC[Se]C x'; echo 'C1CC%C1'; echo 'CC(C)C'; printf 'O=C=O\0junk\n'; } | mk 02 smi_bad_lines
echo "corpus written to $c ($(du -sh "$c" | cut -f1))"
