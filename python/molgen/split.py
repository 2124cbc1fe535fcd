"""The training / validation split `molgen train` makes, written out: which
molecules a model was validated on and never trained on (a test split for
`molgen.metrics --ref` and for the memorisation check of `molgen score`).

molgen/chem/data.c's mg_dataset_split: indices 0..n-1 of the kept records are
shuffled by Fisher-Yates driven by SplitMix64 seeded with --seed; the first
round(n * val_frac) shuffled indices are the validation split, each split
kept in file order. This module reads a .smi file as molgen does when every
line is a molecule (first whitespace-separated field; blank lines skipped):
give it the same file, --val-frac and --seed as the training run.

    python3 -m molgen.split DATA --val-frac 0.05 --seed 1 --train T.smi --val V.smi
"""

import argparse
import math
import sys

_MASK = (1 << 64) - 1


def _splitmix64(state):
    """(new state, output): molgen/base/util.h's mg_splitmix64."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


def split_indices(n, val_frac, seed):
    """(train indices, validation indices), each ascending."""
    nval = int(math.floor(n * val_frac + 0.5))
    if nval >= n > 0:
        nval = n - 1
    idx = list(range(n))
    st = seed & _MASK
    for i in range(n - 1, 0, -1):
        st, r = _splitmix64(st)
        j = r % (i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    val = sorted(idx[:nval])
    pick = set(val)
    return [i for i in range(n) if i not in pick], val


def read_molecules(path):
    out = []
    with open(path, encoding='utf-8') as f:
        for line in f:
            fields = line.split()
            if fields:
                out.append(fields[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.split', description=__doc__.split('\n\n')[0])
    ap.add_argument('data', help='the .smi file given to molgen train --data')
    ap.add_argument('--val-frac', type=float, default=0.05, help='as given to molgen train (default 0.05)')
    ap.add_argument('--seed', type=int, default=1, help='as given to molgen train (default 1)')
    ap.add_argument('--train', help='write the training split here')
    ap.add_argument('--val', help='write the validation split here')
    a = ap.parse_args(argv)
    if not 0 <= a.val_frac < 1 or a.seed < 0:
        sys.stderr.write('molgen.split: --val-frac must be in [0, 1) and --seed >= 0\n')
        return 2
    mols = read_molecules(a.data)
    tr, va = split_indices(len(mols), a.val_frac, a.seed)
    for path, rows in ((a.train, tr), (a.val, va)):
        if path:
            with open(path, 'w') as f:
                f.writelines(mols[i] + '\n' for i in rows)
    sys.stderr.write('%s: %d molecules, %d train / %d validation (seed %d)\n'
                     % (a.data, len(mols), len(tr), len(va), a.seed))
    return 0


if __name__ == '__main__':
    sys.exit(main())
