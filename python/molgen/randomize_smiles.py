"""Randomized SMILES for `molgen train --augment randomized` (issue 15).

    /usr/bin/python3 -m molgen.randomize_smiles DATA.smi OUT.aug [--k 10] [--seed 1] [--jobs J]

For every line of DATA.smi (first whitespace-separated field, as molgen
reads a .smi) OUT gets one line with K random valid SMILES of that molecule:
RDKit's MolToRandomSmilesVect (random atom order, the semantics of
MolToSmiles(doRandom=True)), seeded per line from --seed, so the file is a
function of (DATA, K, seed). Blank lines, '#' lines and molecules RDKit
cannot parse give an empty line (the trainer then uses the molecule as
written). The first line is a header the trainer checks:
    #molgen-augment v1 k=K seed=S lines=N source=NAME
where N is the number of lines of DATA.smi (line i + 1 of OUT holds line
i's copies). Written atomically (a temporary file renamed over OUT).
--bench N: only time N molecules, print randomized SMILES per second.
"""
import argparse
import os
import re
import sys
import time
from multiprocessing import Pool

from molgen.atomic import atomic_open


def _copies(args):
    smi, k, seed = args
    from rdkit import Chem
    if not smi or smi.startswith('#'):
        return ''
    m = Chem.MolFromSmiles(smi)
    if m is None or m.GetNumAtoms() == 0:
        return ''
    return ' '.join(Chem.MolToRandomSmilesVect(m, k, randomSeed=seed))


def _line_seed(seed, i):
    # RDKit seeds with a positive 31-bit int; distinct per (seed, line)
    return (seed * 1000003 + i * 7919) % 2147483647 + 1


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.randomize_smiles',
                                     description=__doc__.split('\n\n')[0])
    ap.add_argument('data')
    ap.add_argument('out', nargs='?')
    ap.add_argument('--k', type=int, default=10, help='copies per molecule (default 10)')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--jobs', type=int, default=os.cpu_count() or 1)
    ap.add_argument('--bench', type=int, default=0, metavar='N')
    a = ap.parse_args(argv)
    try:
        from rdkit import RDLogger
        RDLogger.DisableLog('rdApp.*')
    except ImportError:
        sys.stderr.write('molgen.randomize_smiles: RDKit is not available '
                         '(Debian: python3-rdkit)\n')
        return 2
    if a.k < 1 or a.k > 1000 or a.jobs < 1 or a.seed < 0:
        sys.stderr.write('molgen.randomize_smiles: need 1 <= --k <= 1000, --jobs >= 1, '
                         '--seed >= 0\n')
        return 2
    if a.data.lower().endswith('.csv'):
        sys.stderr.write('molgen.randomize_smiles: %s: only .smi files (one molecule per line)\n'
                         % a.data)
        return 2
    try:
        with open(a.data) as f:
            # molgen's reader ends lines at \n, \r\n or a lone \r (not at
            # the other breaks str.splitlines knows: form feed, U+2028 ...)
            text = re.split(r'\r\n|\r|\n', f.read())
            if text and text[-1] == '':
                text.pop()
            lines = [(l.split() or [''])[0] for l in text]
    except (OSError, UnicodeDecodeError) as e:
        sys.stderr.write('molgen.randomize_smiles: %s: %s\n' % (a.data, e))
        return 1
    if a.bench:
        lines = [l for l in lines if l and not l.startswith('#')][:a.bench]
    elif not a.out:
        sys.stderr.write('molgen.randomize_smiles: give OUT (or --bench N)\n')
        return 2
    elif os.path.exists(a.out) and os.path.samefile(a.out, a.data):
        sys.stderr.write('molgen.randomize_smiles: OUT is the data file\n')
        return 2
    work = [(s, a.k, _line_seed(a.seed, i)) for i, s in enumerate(lines)]
    t0 = time.time()
    with Pool(a.jobs) as pool:
        out = pool.map(_copies, work, chunksize=512)
    dt = time.time() - t0
    n = sum(1 for o in out if o)
    rate = n * a.k / dt if dt > 0 else float('inf')
    sys.stderr.write('%d molecules x %d copies in %.1f s: %.0f randomized SMILES/s (%d jobs); '
                     '%d lines without copies\n' % (n, a.k, dt, rate, a.jobs, len(out) - n))
    if a.bench:
        return 0
    try:
        with atomic_open(a.out) as f:
            f.write('#molgen-augment v1 k=%d seed=%d lines=%d source=%s\n'
                    % (a.k, a.seed, len(lines), os.path.basename(a.data)))
            for o in out:
                f.write(o + '\n')
    except OSError as e:
        sys.stderr.write('molgen.randomize_smiles: %s: %s\n' % (a.out, e))
        return 1
    print(a.out)
    return 0


if __name__ == '__main__':
    sys.exit(main())
