"""MOSES's Filters (Polykovskiy et al. 2020, molecules/moses utils.py
mol_passes_filters): a molecule passes when it has no ring of 8 or more
atoms, no charged atom, only the elements C, N, S, O, F, Cl, Br, H, matches
none of the MCF and PAINS SMARTS shipped beside this file (mcf.csv,
wehi_pains.csv: MOSES's lists; LICENSE, README.md) and its canonical SMILES
reads back. `MosesFilters(dir).failure(mol)` says the first clause a
molecule fails; molgen.metrics reports the pass rate, molgen.scoring's
`moses_filters` component scores it.

The patterns are screened by counts before RDKit's matcher runs (a pattern
needs at least as many atoms of each element and bonds of each kind as its
query restricts): the same verdicts as trying every pattern, several times
faster (molgen/tests/metrics/test_metrics.py checks them against the plain loop).
"""
import os
import re

FILTERS_DIR = os.path.dirname(os.path.abspath(__file__))

FILTERS_ALLOWED = frozenset(('C', 'N', 'S', 'O', 'F', 'Cl', 'Br', 'H'))
_QUERY_LEAF = re.compile(r'(AtomAtomicNum|AtomType|BondOrder) (\d+) = val$')


class FilterDataError(Exception):
    """The filter SMARTS files are missing or do not parse."""


def read_filter_smarts(directory=FILTERS_DIR):
    """[(source, name, smarts)] in MOSES's order: mcf.csv (header
    'names,smarts'), then wehi_pains.csv (no header; rows
    "SMARTS","<regId=NAME>" with spaces padding the SMARTS field)."""
    import csv
    out = []
    for fname, source, header in (('mcf.csv', 'MCF', True), ('wehi_pains.csv', 'PAINS', False)):
        path = os.path.join(directory, fname)
        try:
            with open(path, newline='', encoding='utf-8') as f:
                rows = list(csv.reader(f))
        except OSError as e:
            raise FilterDataError('cannot read %s: %s' % (path, e.strerror or e))
        except (UnicodeDecodeError, csv.Error) as e:
            raise FilterDataError('%s is not a UTF-8 CSV file: %s' % (path, e))
        if header:
            if not rows or [c.strip() for c in rows[0]] != ['names', 'smarts']:
                raise FilterDataError("%s: first line is not the header 'names,smarts'" % path)
            rows = [(i + 2, r) for i, r in enumerate(rows[1:])]
        else:
            rows = [(i + 1, r) for i, r in enumerate(rows)]
        for line, r in rows:
            if len(r) != 2 or not r[0].strip() or not r[1].strip():
                raise FilterDataError('%s:%d: expected 2 non-empty fields (name and SMARTS), '
                                      'got %d field(s)' % (path, line, len(r)))
            name, smarts = (r[0], r[1]) if header else (r[1], r[0])
            name = name.strip()
            if name.startswith('<regId=') and name.endswith('>'):
                name = name[len('<regId='):-1]
            out.append((source, name, smarts.strip()))
    return out


def _conjuncts(query):
    """{primitive: {values}} of the positive AtomAtomicNum, AtomType and
    BondOrder leaves of an RDKit query tree (DescribeQuery text, two spaces of
    indent per level) that are its root or are reached from the root through
    AND nodes only: conditions every matching atom or bond meets."""
    lines = query.DescribeQuery().splitlines()
    found = {}

    def indent(i):
        return len(lines[i]) - len(lines[i].lstrip(' '))

    def walk(i):
        text = lines[i].strip()
        if text in ('AtomAnd', 'BondAnd'):
            j = i + 1
            while j < len(lines) and indent(j) > indent(i):
                if indent(j) == indent(i) + 2:
                    walk(j)
                j += 1
            return
        m = _QUERY_LEAF.match(text)
        if m:
            found.setdefault(m.group(1), set()).add(int(m.group(2)))

    if lines:
        walk(0)
    return found


def _required_atom(qatom):
    """(Z, T) for a SMARTS query atom that can only match atoms of element Z
    (T = Z + 1000 * aromatic, RDKit's AtomType, when the query also fixes the
    aromaticity, else None), or None when it may match several elements. Kept
    only when it agrees with the atomic number RDKit's SMARTS parser gives
    the atom."""
    c = _conjuncts(qatom)
    t = c.get('AtomType', set())
    z = c.get('AtomAtomicNum', set()) | set(v % 1000 for v in t)
    if len(z) != 1 or len(t) > 1 or next(iter(z)) != qatom.GetAtomicNum():
        return None
    return next(iter(z)), (next(iter(t)) if t else None)


def _required_bond(qbond):
    """(Za, Zb, order) with Za <= Zb for a SMARTS query bond that can only
    match bonds of RDKit type `order` (1, 2, 3, 12 = aromatic) between atoms
    of elements Za and Zb, or None. Kept only when the order agrees with the
    bond type RDKit's SMARTS parser gives the bond."""
    o = _conjuncts(qbond).get('BondOrder', set())
    a, b = _required_atom(qbond.GetBeginAtom()), _required_atom(qbond.GetEndAtom())
    if len(o) != 1 or a is None or b is None or next(iter(o)) != int(qbond.GetBondType()):
        return None
    return min(a[0], b[0]), max(a[0], b[0]), next(iter(o))


def _count_keys(mol):
    """{key: count} of mol's atoms and bonds under the keys of the query
    requirements: ('Z', Z), ('T', Z + 1000 * aromatic), ('B', Za, Zb, order)."""
    out = {}
    for a in mol.GetAtoms():
        z = a.GetAtomicNum()
        for k in (('Z', z), ('T', z + 1000 * a.GetIsAromatic())):
            out[k] = out.get(k, 0) + 1
    for b in mol.GetBonds():
        za, zb = b.GetBeginAtom().GetAtomicNum(), b.GetEndAtom().GetAtomicNum()
        k = ('B', min(za, zb), max(za, zb), int(b.GetBondType()))
        out[k] = out.get(k, 0) + 1
    return out


class MosesFilters:
    """MOSES's Filters rule over the parsed SMARTS lists.

    A pattern matches injectively (distinct query atoms on distinct atoms,
    so distinct query bonds on distinct bonds), so it can only match a
    molecule with at least as many atoms of each element (and element +
    aromaticity), and bonds of each element pair + order, as the pattern has
    query atoms and bonds restricted to them: `need` [patterns, keys] holds
    those counts, and the patterns whose counts the molecule does not reach
    are skipped before RDKit's matcher runs. The verdict is the one of trying
    every pattern."""

    def __init__(self, directory=FILTERS_DIR):
        import numpy as np
        from rdkit import Chem
        self.patterns = read_filter_smarts(directory)
        self.queries = []
        for source, name, smarts in self.patterns:
            q = Chem.MolFromSmarts(smarts)
            if q is None:
                raise FilterDataError('%s pattern %s does not parse as SMARTS: %s'
                                      % (source, name, smarts))
            self.queries.append(q)
        reqs = []
        for q in self.queries:
            need = {}
            for a in q.GetAtoms():
                r = _required_atom(a)
                if r is not None:
                    for k in [('Z', r[0])] + ([('T', r[1])] if r[1] is not None else []):
                        need[k] = need.get(k, 0) + 1
            for b in q.GetBonds():
                r = _required_bond(b)
                if r is not None:
                    need[('B',) + r] = need.get(('B',) + r, 0) + 1
            reqs.append(need)
        self.keys = sorted(set(k for need in reqs for k in need))
        col = {k: i for i, k in enumerate(self.keys)}
        self.need = np.zeros((len(reqs), len(self.keys)), dtype=np.int32)
        for p, need in enumerate(reqs):
            for k, n in need.items():
                self.need[p, col[k]] = n

    def candidates(self, hmol):
        """Indices of the patterns that the counts of hmol allow, in order."""
        import numpy as np
        have = _count_keys(hmol)
        have = np.array([have.get(k, 0) for k in self.keys], dtype=np.int32)
        return np.flatnonzero((self.need <= have).all(axis=1))

    def failure(self, mol):
        """None if mol (an RDKit molecule, or None) passes, else (clause,
        detail) for the first clause it fails, in MOSES's order: 'ring',
        'charge', 'element', 'MCF' or 'PAINS' (detail: the pattern's name),
        'smiles'."""
        from rdkit import Chem
        if mol is None:
            return ('smiles', 'does not parse')
        big = [len(r) for r in mol.GetRingInfo().AtomRings() if len(r) >= 8]
        if big:
            return ('ring', '%d-membered ring' % max(big))
        for a in mol.GetAtoms():
            if a.GetFormalCharge() != 0:
                return ('charge', '%s%+d' % (a.GetSymbol(), a.GetFormalCharge()))
        for a in mol.GetAtoms():
            if a.GetSymbol() not in FILTERS_ALLOWED:
                return ('element', a.GetSymbol())
        h = Chem.AddHs(mol)
        for p in self.candidates(h):
            if h.HasSubstructMatch(self.queries[p]):
                return self.patterns[p][0], self.patterns[p][1]
        smi = Chem.MolToSmiles(mol, isomericSmiles=False)
        if not smi or Chem.MolFromSmiles(smi) is None:
            return ('smiles', 'canonical SMILES does not parse again')
        return None


_DEFAULT = None  # MosesFilters of this process (workers inherit it by fork)


def default():
    """The shipped lists' MosesFilters, built once per process."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = MosesFilters(FILTERS_DIR)
    return _DEFAULT


def filters_summary(failures):
    """(fraction passing, {clause: count of failures}) of a list of verdicts."""
    if not failures:
        return float('nan'), {}
    by = {}
    for v in failures:
        if v is not None:
            by[v[0]] = by.get(v[0], 0) + 1
    return 1.0 - sum(by.values()) / len(failures), by
