"""Molecular properties of a SMILES file, as a CSV for conditional training.

Usage:
    /usr/bin/python3 -m molgen.props MOLS.smi [--out MOLS.csv] [--jobs J] [-q]

Writes the CSV `smiles,logp,qed,sas,tpsa,mw,scaffold` (default: beside the
input, its extension replaced by .csv), one row per molecule that RDKit
parses, in the input's order:
  logp      Crippen logP (Wildman & Crippen 1999; rdkit.Chem.Crippen.MolLogP)
  qed       QED (Bickerton et al. 2012; rdkit.Chem.QED.qed)
  sas       synthetic accessibility score (Ertl & Schuffenhauer 2009), the
            sascorer.py of RDKit's Contrib directory (Debian ships it in
            rdkit-data: /usr/share/RDKit/Contrib/SA_Score)
  tpsa      topological polar surface area, A^2 (rdMolDescriptors.CalcTPSA)
  mw        average molecular weight (Descriptors.MolWt)
  scaffold  Bemis-Murcko scaffold SMILES (MurckoScaffold; '' for a molecule
            without rings)
Lines that RDKit cannot parse are skipped and counted (a summary on stderr).
The output is written to a temporary file and renamed at the end; progress
goes to stderr. molgen.metrics computes its conditioning properties with the
functions below.
"""

import argparse
import os
import sys
import time

from molgen.atomic import atomic_open

COLUMNS = ('smiles', 'logp', 'qed', 'sas', 'tpsa', 'mw', 'scaffold')
PROPERTIES = ('logp', 'qed', 'sas', 'tpsa', 'mw')

_SA = None


def sascorer():
    """RDKit Contrib's sascorer module (exits with a message if absent)."""
    global _SA
    if _SA is None:
        import importlib.util
        from rdkit.Chem import RDConfig
        d = os.path.join(RDConfig.RDContribDir, 'SA_Score')
        # loaded from its file: the Contrib folder is not a package
        spec = importlib.util.spec_from_file_location('sascorer', os.path.join(d, 'sascorer.py'))
        sa = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(sa)
        except (OSError, ImportError) as e:
            raise RuntimeError('RDKit Contrib SA_Score not found in %s (%s): install Debian '
                               'rdkit-data' % (d, e))
        _SA = sa
    return _SA


def murcko_scaffold(mol, min_rings=0):
    """The Bemis-Murcko scaffold of an RDKit molecule (RDKit's
    MurckoScaffold: its ring systems and the linkers between them, side
    chains cut) as canonical isomeric SMILES: '' for an acyclic molecule.
    None when RDKit cannot build it, or when it has fewer than min_rings
    rings (MOSES's Scaf metric counts scaffolds of >= 2 rings only). The one
    scaffold of the package: the scorer's scaffold= field, the metrics, the
    condition checks and the run report all call it."""
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold
    try:
        sm = MurckoScaffold.GetScaffoldForMol(mol)
        smi = Chem.MolToSmiles(sm)
    except (ValueError, RuntimeError):
        return None
    if sm.GetRingInfo().NumRings() < min_rings:
        return None
    return smi


def properties(mol):
    """{logp, qed, sas, tpsa, mw} of an RDKit molecule."""
    from rdkit.Chem import Crippen, Descriptors, QED, rdMolDescriptors
    return {'logp': float(Crippen.MolLogP(mol)), 'qed': float(QED.qed(mol)),
            'sas': float(sascorer().calculateScore(mol)),
            'tpsa': float(rdMolDescriptors.CalcTPSA(mol)), 'mw': float(Descriptors.MolWt(mol))}


def row(smi):
    """The CSV fields of one SMILES, or None if RDKit does not parse it."""
    from rdkit import Chem
    m = Chem.MolFromSmiles(smi) if smi else None
    if m is None or m.GetNumAtoms() == 0:
        return None
    p = properties(m)
    return [smi] + ['%.4f' % p[k] for k in PROPERTIES] + [murcko_scaffold(m)]


def _rows(chunk):
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')
    return [row(s) for s in chunk]


def _csv_field(s):
    return '"' + s.replace('"', '""') + '"' if any(c in s for c in ',"') else s


def read_smiles(path):
    """First field of each non-blank, non-'#' line."""
    out = []
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            s = line.strip()
            if s and not s.startswith('#'):
                out.append(s.split()[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.props',
                                     description='logP, QED, SA score, TPSA, MW and Murcko '
                                     'scaffold of a SMILES file, as CSV')
    ap.add_argument('smiles', help='.smi file (first field of each line)')
    ap.add_argument('--out', help='CSV to write (default: the input with .csv)')
    ap.add_argument('--jobs', type=int, default=1, help='worker processes (default 1)')
    ap.add_argument('-q', '--quiet', action='store_true', help='no progress lines')
    a = ap.parse_args(argv)
    try:
        from rdkit import Chem  # noqa: F401
        sascorer()
    except Exception as e:
        sys.stderr.write('molgen.props: %s (run with /usr/bin/python3, Debian python3-rdkit)\n' % e)
        return 2
    if not os.path.isfile(a.smiles):
        sys.stderr.write('molgen.props: no such file: %s\n' % a.smiles)
        return 2
    if a.jobs < 1:
        sys.stderr.write('molgen.props: --jobs must be >= 1\n')
        return 2
    out = a.out or os.path.splitext(a.smiles)[0] + '.csv'
    if os.path.abspath(out) == os.path.abspath(a.smiles):
        sys.stderr.write('molgen.props: the output would overwrite the input\n')
        return 2
    w = atomic_open(out, 'w', encoding='utf-8')  # a new temporary beside out
    try:
        f = w.__enter__()
    except OSError as e:
        sys.stderr.write('molgen.props: cannot write %s: %s\n' % (out, e))
        return 1
    smiles = read_smiles(a.smiles)
    chunk = 1000
    chunks = [smiles[i:i + chunk] for i in range(0, len(smiles), chunk)]
    t0 = time.time()
    done = bad = 0
    pool = None
    try:
        if a.jobs > 1:
            import multiprocessing as mp
            pool = mp.get_context('fork').Pool(a.jobs)
            results = pool.imap(_rows, chunks)
        else:
            results = map(_rows, chunks)
        f.write(','.join(COLUMNS) + '\n')
        for rows in results:
            for r in rows:
                if r is None:
                    bad += 1
                else:
                    f.write(','.join(_csv_field(x) for x in r) + '\n')
            done += len(rows)
            if not a.quiet:
                el = time.time() - t0
                sys.stderr.write('\rprops: %d / %d molecules, %.0f s, %.0f mol/s' %
                                 (done, len(smiles), el, done / el if el > 0 else 0))
                sys.stderr.flush()
    except BaseException as e:
        w.__exit__(type(e), e, e.__traceback__)  # closes and removes the temporary
        raise
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    w.__exit__(None, None, None)  # renamed over out
    if not a.quiet:
        sys.stderr.write('\n')
    sys.stderr.write('props: %s: %d molecules written, %d unparsable skipped, %.1f s\n' %
                     (out, done - bad, bad, time.time() - t0))
    return 0


if __name__ == '__main__':
    sys.exit(main())
