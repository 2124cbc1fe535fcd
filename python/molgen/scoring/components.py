"""Score components: functions of an RDKit molecule (its raw value).

Kinds whose raw value is already a score in [0, 1] (a modifier optional):
  qed            QED (Bickerton et al. 2012; rdkit.Chem.QED.qed)
  similarity     Tanimoto similarity to `target` (or the max / mean over
                 `targets`) with `fingerprint` = ECFP4 | ECFP6 | FCFP4 | FCFP6
                 (Morgan radius 2 / 3 count fingerprints, as GuacaMol's
                 get_fingerprint: AllChem.GetMorganFingerprint, useFeatures
                 for FCFP) | AP (atom pairs, maxLength 10) | PHCO (Gobbi 2D
                 pharmacophore, Pharm2D Gen2DFingerprint)
  smarts         1 if `pattern` (SMARTS) matches, else 0; `forbidden = true`
                 inverts it (GuacaMol's SMARTSScoringFunction)
  isomer         GuacaMol's isomer score of molecular `formula`: the
                 geometric (or `mean = "arithmetic"`) mean of a Gaussian
                 (sigma 1) of each formula element's atom count (H included,
                 as Chem.AddHs gives) and a Gaussian (sigma 2) of the total
                 atom count with hydrogens
  moses_filters  1 if the molecule passes MOSES's Filters (molgen.metrics:
                 ring size, charge, elements, the MCF and PAINS SMARTS), else 0
  alerts         1 if none of `smarts` (a list of SMARTS) matches, else 0
Kinds with a raw value in their own unit (a modifier is required):
  sa              synthetic accessibility, 1 (easy) .. 10 (RDKit Contrib sascorer)
  logp            Crippen logP            tpsa            TPSA, A^2
  mw              average molecular weight (Descriptors.MolWt)
  hbd, hba        H-bond donors / acceptors (rdMolDescriptors.CalcNumHBD / HBA)
  rotatable_bonds rdMolDescriptors.CalcNumRotatableBonds
  rings           ring count              aromatic_rings  aromatic ring count
  formal_charge   the molecule's net formal charge
  heavy_atoms     heavy-atom count        bertz           BertzCT complexity
  atom_count      atoms of `element` (H counted with Chem.AddHs)
"""

import math
import re

from .modifiers import ConfigError

FINGERPRINTS = ('ECFP4', 'ECFP6', 'FCFP4', 'FCFP6', 'AP', 'PHCO')
_FORMULA = re.compile(r'([A-Z][a-z]?)(\d*)')


def fingerprint(mol, kind):
    """The fingerprint `kind` of an RDKit molecule (a sparse count vector)."""
    from rdkit.Chem import AllChem
    if kind in ('ECFP4', 'ECFP6', 'FCFP4', 'FCFP6'):
        return AllChem.GetMorganFingerprint(mol, 2 if kind.endswith('4') else 3,
                                            useFeatures=kind.startswith('F'))
    if kind == 'AP':
        return AllChem.GetAtomPairFingerprint(mol, maxLength=10)
    from rdkit.Chem.Pharm2D import Generate, Gobbi_Pharm2D
    return Generate.Gen2DFingerprint(mol, Gobbi_Pharm2D.factory)


def _fp_empty(fp):
    """True when a fingerprint (sparse count vector or bit vector) has no
    feature set."""
    if hasattr(fp, 'GetNonzeroElements'):
        return not fp.GetNonzeroElements()
    return fp.GetNumOnBits() == 0


def parse_formula(formula, where):
    """[(element, count)] of a molecular formula such as C9H10N2O2PF2Cl."""
    from rdkit import Chem
    if not isinstance(formula, str) or not re.fullmatch(r'([A-Z][a-z]?\d*)+', formula):
        raise ConfigError('%s: formula %r is not a molecular formula like C7H8N2O2'
                          % (where, formula))
    counts = {}
    table = Chem.GetPeriodicTable()
    for el, n in _FORMULA.findall(formula):
        try:
            ok = table.GetAtomicNumber(el) > 0
        except RuntimeError:
            ok = False
        if not ok:
            raise ConfigError('%s: formula %r: %r is not an element' % (where, formula, el))
        counts[el] = counts.get(el, 0) + (int(n) if n else 1)
    return list(counts.items())


def _mol(smiles, where, key):
    from rdkit import Chem
    m = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) and smiles else None
    if m is None or m.GetNumAtoms() == 0:
        raise ConfigError('%s: %s %r is not a SMILES that RDKit parses' % (where, key, smiles))
    return m


def _smarts(s, where, key):
    from rdkit import Chem
    q = Chem.MolFromSmarts(s) if isinstance(s, str) and s else None
    if q is None:
        raise ConfigError('%s: %s %r is not a SMARTS that RDKit parses' % (where, key, s))
    return q


def _element_count(mol, el):
    from rdkit import Chem
    if el == 'H':
        mol = Chem.AddHs(mol)
    return sum(1 for a in mol.GetAtoms() if a.GetSymbol() == el)


class Component:
    """kind, options (the TOML keys besides name/weight/modifier), unit
    (True: the raw value is a score in [0, 1])."""
    kind = None
    unit = False
    options = {}   # key -> required (True) / optional (False)

    def __init__(self, opts, where):
        for k in opts:
            if k not in self.options:
                raise ConfigError('%s: component %r has no key %r (it takes: %s)'
                                  % (where, self.kind, k,
                                     ', '.join(['name', 'weight', 'modifier'] + sorted(self.options))))
        for k, req in self.options.items():
            if req and k not in opts:
                raise ConfigError('%s: component %r needs %r' % (where, self.kind, k))
        self.setup(opts, where)

    def setup(self, opts, where):
        pass

    def raw(self, mol):
        raise NotImplementedError


def _descriptor(kind_name, fn, doc_unit=False):
    cls = type(kind_name, (Component,), {'kind': kind_name, 'unit': doc_unit,
                                         'raw': lambda self, mol: float(fn(mol))})
    return cls


def _qed(mol):
    from rdkit.Chem import QED
    return QED.qed(mol)


def _sa(mol):
    from molgen.props import sascorer
    return sascorer().calculateScore(mol)


def _d(name):
    def f(mol):
        from rdkit.Chem import Descriptors
        return getattr(Descriptors, name)(mol)
    return f


def _r(name):
    def f(mol):
        from rdkit.Chem import rdMolDescriptors
        return getattr(rdMolDescriptors, name)(mol)
    return f


def _charge(mol):
    from rdkit import Chem
    return Chem.GetFormalCharge(mol)


class Similarity(Component):
    kind = 'similarity'
    unit = True
    options = {'target': False, 'targets': False, 'fingerprint': False, 'reduce': False}

    def setup(self, opts, where):
        if ('target' in opts) == ('targets' in opts):
            raise ConfigError('%s: component "similarity" needs one of target (a SMILES) or '
                              'targets (a list of SMILES)' % where)
        targets = [opts['target']] if 'target' in opts else opts['targets']
        if not isinstance(targets, list) or not targets:
            raise ConfigError('%s: targets must be a non-empty list of SMILES' % where)
        self.fp = opts.get('fingerprint', 'ECFP4')
        if self.fp not in FINGERPRINTS:
            raise ConfigError('%s: fingerprint %r is not one of: %s'
                              % (where, self.fp, ', '.join(FINGERPRINTS)))
        self.reduce = opts.get('reduce', 'max')
        if self.reduce not in ('max', 'mean'):
            raise ConfigError('%s: reduce %r is not "max" or "mean"' % (where, self.reduce))
        self.target_fps = [fingerprint(_mol(t, where, 'target'), self.fp) for t in targets]
        for t, fp in zip(targets, self.target_fps):
            # an empty target fingerprint makes Tanimoto 0/0: RDKit says 1.0
            # for every molecule whose fingerprint is empty too (methane)
            if _fp_empty(fp):
                raise ConfigError('%s: target %r has an empty %s fingerprint (no feature this '
                                  'fingerprint sees): its similarity to anything is undefined; '
                                  'choose another fingerprint or target' % (where, t, self.fp))

    def raw(self, mol):
        from rdkit import DataStructs
        fp = fingerprint(mol, self.fp)
        s = [DataStructs.TanimotoSimilarity(t, fp) for t in self.target_fps]
        return max(s) if self.reduce == 'max' else sum(s) / len(s)


class Smarts(Component):
    kind = 'smarts'
    unit = True
    options = {'pattern': True, 'forbidden': False}

    def setup(self, opts, where):
        self.query = _smarts(opts['pattern'], where, 'pattern')
        self.forbidden = opts.get('forbidden', False)
        if not isinstance(self.forbidden, bool):
            raise ConfigError('%s: forbidden must be true or false' % where)

    def raw(self, mol):
        return float(mol.HasSubstructMatch(self.query) != self.forbidden)


class Isomer(Component):
    kind = 'isomer'
    unit = True
    options = {'formula': True, 'mean': False}

    def setup(self, opts, where):
        self.counts = parse_formula(opts['formula'], where)
        self.total = sum(n for _, n in self.counts)
        self.mean = opts.get('mean', 'geometric')
        if self.mean not in ('geometric', 'arithmetic'):
            raise ConfigError('%s: mean %r is not "geometric" or "arithmetic"' % (where, self.mean))

    def raw(self, mol):
        from rdkit import Chem
        h = Chem.AddHs(mol)
        s = [math.exp(-0.5 * (_element_count(h, el) - n) ** 2) for el, n in self.counts]
        s.append(math.exp(-0.5 * ((h.GetNumAtoms() - self.total) / 2.0) ** 2))
        if self.mean == 'arithmetic':
            return sum(s) / len(s)
        return 0.0 if min(s) == 0.0 else math.exp(sum(math.log(v) for v in s) / len(s))


class MosesFiltersComponent(Component):
    kind = 'moses_filters'
    unit = True
    _filters = None

    def raw(self, mol):
        if MosesFiltersComponent._filters is None:
            from molgen import moses_filters
            MosesFiltersComponent._filters = moses_filters.default()
        return float(MosesFiltersComponent._filters.failure(mol) is None)


class Alerts(Component):
    kind = 'alerts'
    unit = True
    options = {'smarts': True}

    def setup(self, opts, where):
        pats = opts['smarts']
        if not isinstance(pats, list) or not pats:
            raise ConfigError('%s: smarts must be a non-empty list of SMARTS' % where)
        self.queries = [_smarts(p, where, 'alert') for p in pats]

    def raw(self, mol):
        return float(not any(mol.HasSubstructMatch(q) for q in self.queries))


class AtomCount(Component):
    kind = 'atom_count'
    options = {'element': True}

    def setup(self, opts, where):
        el = opts['element']
        if not isinstance(el, str) or not re.fullmatch(r'[A-Z][a-z]?', el):
            raise ConfigError('%s: element %r is not an element symbol' % (where, el))
        parse_formula(el, where)
        self.element = el

    def raw(self, mol):
        return float(_element_count(mol, self.element))


COMPONENTS = {c.kind: c for c in (
    _descriptor('qed', _qed, True),
    _descriptor('sa', _sa),
    _descriptor('logp', _d('MolLogP')),
    _descriptor('tpsa', _d('TPSA')),
    _descriptor('mw', _d('MolWt')),
    _descriptor('hbd', _r('CalcNumHBD')),
    _descriptor('hba', _r('CalcNumHBA')),
    _descriptor('rotatable_bonds', _r('CalcNumRotatableBonds')),
    _descriptor('rings', _r('CalcNumRings')),
    _descriptor('aromatic_rings', _r('CalcNumAromaticRings')),
    _descriptor('formal_charge', _charge),
    _descriptor('heavy_atoms', lambda m: m.GetNumHeavyAtoms()),
    _descriptor('bertz', _d('BertzCT')),
    Similarity, Smarts, Isomer, MosesFiltersComponent, Alerts, AtomCount)}
