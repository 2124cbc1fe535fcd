"""Tests of molgen.metrics on tiny hand-made sets whose answers follow from
the definitions. Run with /usr/bin/python3 -m pytest (needs RDKit + numpy)."""
import importlib
import json
import math
import os
import subprocess
import sys
from collections import Counter

import pytest

np = pytest.importorskip('numpy')
pytest.importorskip('rdkit')

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = ['-m', 'molgen.metrics']
M = importlib.import_module('molgen.metrics')
F = importlib.import_module('molgen.moses_filters')


def _write(path, lines):
    path.write_text(''.join(s + '\n' for s in lines))
    return str(path)


def test_validity_one_invalid_of_four():
    canon = [M._canon(s) for s in ['CCO', 'c1ccccc1', 'C1CC', 'CC(=O)O']]
    assert canon[2] is None  # unclosed ring
    assert M.fraction_valid(canon) == 0.75


def test_empty_and_garbage_are_invalid():
    assert M._canon('') is None
    assert M._canon('not a smiles') is None
    assert M._canon('c1cccc1') is None  # cannot be kekulised
    assert M.fraction_valid([M._canon(s) for s in ['', 'C']]) == 0.5


def test_unique_at_k_uses_canonical_forms():
    valid = [M._canon(s) for s in ['CCO', 'OCC', 'C(O)C', 'C']]
    assert len(set(valid)) == 2
    u, n, complete = M.unique_at_k(valid, 1000)
    assert (u, n, complete) == (0.5, 4, False)
    u, n, complete = M.unique_at_k(valid, 2)  # first two are the same molecule
    assert (u, n, complete) == (0.5, 2, True)
    assert math.isnan(M.unique_at_k([], 10)[0])


def test_novelty_against_canonical_training_set():
    train = {M._canon('OCC')}  # ethanol written differently
    gen = [M._canon(s) for s in ['CCO', 'CCN', 'CCN']]
    # distinct generated: {CCO, CCN}; CCO is in training -> 1/2 novel
    assert M.novelty(gen, train) == 0.5
    assert M.novelty(gen, set()) == 1.0


def test_tanimoto_and_internal_diversity_on_bit_vectors():
    a = np.array([[1, 1, 0, 0]], dtype=np.uint8)
    b = np.array([[1, 0, 1, 0]], dtype=np.uint8)
    # |a & b| = 1, |a | b| = 3
    assert M.tanimoto_max_mean(a, b)[0] == pytest.approx(1 / 3)
    same = np.array([[1, 0, 1, 1]] * 5, dtype=np.uint8)
    assert M.internal_diversity(same, 1) == pytest.approx(0.0)
    assert M.internal_diversity(same, 2) == pytest.approx(0.0)
    disjoint = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=np.uint8)
    # T = identity; MOSES includes self pairs: mean T = 1/2
    assert M.internal_diversity(disjoint, 1) == pytest.approx(0.5)
    assert M.internal_diversity(disjoint, 2) == pytest.approx(1 - math.sqrt(0.5))
    # two all-zero fingerprints count as identical (0/0 -> 1, as MOSES)
    z = np.zeros((2, 8), dtype=np.uint8)
    assert M.internal_diversity(z, 1) == pytest.approx(0.0)


def test_internal_diversity_of_identical_molecules_is_zero():
    from rdkit import Chem
    fps = np.stack([M._fp_bits(Chem.MolFromSmiles(s)) for s in ['c1ccccc1O', 'Oc1ccccc1'] * 2])
    assert M.internal_diversity(fps, 1) == pytest.approx(0.0)
    assert M.snn(fps, fps) == pytest.approx(1.0)


def test_snn_is_mean_of_nearest_neighbour_similarity():
    gen = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], dtype=np.uint8)
    ref = np.array([[1, 1, 0, 0], [0, 0, 1, 0]], dtype=np.uint8)
    # gen0: best 1 (ref0); gen1: best 1/2 (ref1)
    assert M.snn(gen, ref) == pytest.approx(0.75)


def test_cos_similarity():
    assert M.cos_similarity(Counter(a=2, b=1), Counter(a=2, b=1)) == pytest.approx(1.0)
    assert M.cos_similarity(Counter(a=1), Counter(b=1)) == pytest.approx(0.0)
    assert M.cos_similarity(Counter(a=1, b=1), Counter(a=1)) == pytest.approx(1 / math.sqrt(2))
    assert math.isnan(M.cos_similarity(Counter(), Counter(a=1)))


def test_wasserstein_1d():
    assert M.wasserstein_1d([0, 1, 3], [5, 6, 8]) == pytest.approx(5.0)  # a shift
    assert M.wasserstein_1d([0, 1], [1, 0]) == pytest.approx(0.0)
    assert M.wasserstein_1d([0], [1, 3]) == pytest.approx(2.0)
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=300), rng.normal(size=200) + 0.5
    # equal-size samples: W1 = mean |sorted u - sorted v|
    u2, v2 = rng.normal(size=400), rng.normal(size=400)
    assert M.wasserstein_1d(u2, v2) == pytest.approx(np.mean(np.abs(np.sort(u2) - np.sort(v2))))
    assert M.wasserstein_1d(u, v) > 0.3
    assert math.isnan(M.wasserstein_1d([], [1.0]))


def test_scaffold_requires_two_rings():
    from rdkit import Chem
    assert M._scaffold(Chem.MolFromSmiles('CCc1ccccc1')) is None  # one ring
    assert M._scaffold(Chem.MolFromSmiles('CCc1ccc(-c2ccccc2)cc1')) == 'c1ccc(-c2ccccc2)cc1'


@pytest.mark.parametrize('smi,scaffold', [
    ('CCCCO', ''),                                       # acyclic: no scaffold
    ('CC(=O)Nc1ccc(O)cc1', 'c1ccccc1'),                  # paracetamol: side chains cut
    ('O=C(O)c1ccccc1OC(C)=O', 'c1ccccc1'),               # aspirin
    ('CCN(CC)CCOC(=O)c1ccc(N)cc1', 'c1ccccc1'),          # procaine
    ('c1ccc(CCN2CCCCC2)cc1', 'c1ccc(CCN2CCCCC2)cc1'),    # the linker between rings stays
    ('C[C@H]1CC[C@@H](c2ccccc2)CC1', 'c1ccc(C2CCCCC2)cc1'),  # stereo of cut atoms goes
])
def test_one_murcko_scaffold_everywhere(smi, scaffold):
    # Bemis-Murcko by hand: ring systems and linkers, every side chain cut;
    # the scorer's field, the report and the metrics all give this one
    from rdkit import Chem
    from molgen import props, report
    from molgen import scoring
    m = Chem.MolFromSmiles(smi)
    want = Chem.MolToSmiles(Chem.MolFromSmiles(scaffold)) if scaffold else ''
    assert props.murcko_scaffold(m) == want
    assert report._scaffold(smi) == want
    assert scoring.murcko_scaffold is props.murcko_scaffold
    # keep the molecule in a name: a RingInfo does not hold its molecule alive
    sm = Chem.MolFromSmiles(scaffold) if scaffold else None
    rings = sm.GetRingInfo().NumRings() if sm is not None else 0
    assert M._scaffold(m) == (want if rings >= 2 else None)   # MOSES: >= 2 rings


def test_compute_metrics_end_to_end():
    samples = ['CCO', 'CCO', 'c1ccccc1', 'C1CC', '', 'CC(=O)Nc1ccccc1']
    train = ['OCC', 'CCCC']
    ref = ['CCO', 'c1ccccc1', 'CC(=O)Nc1ccccc1', 'CCN']
    r = M.compute_metrics(samples, train, ref, jobs=1)
    assert r['n_samples'] == 6 and r['n_valid'] == 4
    assert r['validity'] == pytest.approx(4 / 6)
    assert r['unique@1k'] == pytest.approx(3 / 4)
    assert r['novelty'] == pytest.approx(2 / 3)  # {CCO, benzene, acetanilide} minus CCO
    assert r['SNN'] == pytest.approx(1.0)  # every valid sample is in the reference
    assert 0.0 < r['IntDiv1'] <= 1.0
    assert r['Frag'] > 0.5
    for k in ('logP', 'QED', 'weight'):
        assert r['wasserstein'][k] >= 0.0
    assert any('unique@10k' in n for n in r['notes'])


def test_sample_whose_canonical_form_does_not_reparse():
    # A real molgen sample: RDKit parses it, but the canonical SMILES it
    # writes (C2=C=N(C)N2C) does not parse again. It is valid, and left out
    # of the fingerprint-based metrics with a note instead of crashing them.
    from rdkit import Chem
    odd = 'CC(=O)Nc1cccc(NC(=O)c2c=n(C)n2C)c1'
    assert Chem.MolFromSmiles(Chem.MolToSmiles(Chem.MolFromSmiles(odd))) is None
    r = M.compute_metrics([odd, 'CCO', 'c1ccccc1'], ['CCCC'], ['CCO', 'CCN'], jobs=1)
    assert r['n_valid'] == 3 and r['n_gen_used'] == 2
    assert r['SNN'] is not None and r['IntDiv1'] is not None
    assert any('re-parse' in n for n in r['notes'])
    r = M.compute_metrics([odd], ['CCCC'], ['CCO'], jobs=1)
    assert r['validity'] == 1.0 and r['IntDiv1'] is None and r['wasserstein'] is None


def test_cli_json_and_table(tmp_path):
    s = _write(tmp_path / 's.smi', ['CCO', 'C1CC', 'c1ccccc1O', 'CCO', ''])
    t = _write(tmp_path / 't.smi', ['# header comment', 'OCC', '', 'CCCC name'])
    r = _write(tmp_path / 'r.smi', ['Oc1ccccc1', 'CCO'])
    out = tmp_path / 'm.json'
    p = subprocess.run([sys.executable] + SCRIPT + [s, '--train', t, '--ref', r, '--json',
                        str(out), '--jobs', '1', '-q'], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert 'valid' in p.stdout and 'novelty' in p.stdout and 'W1 QED' in p.stdout
    assert 'Filters' in p.stdout and 'FCD' in p.stdout and 'not computed' in p.stdout
    j = json.loads(out.read_text())
    # blank lines at the end of the file are not samples
    assert j['n_samples'] == 4
    assert j['n_valid'] == 3
    assert j['n_train'] == 2
    assert j['novelty'] == pytest.approx(0.5)  # {CCO, phenol}; CCO in training
    assert j['SNN'] == pytest.approx(1.0)
    assert j['Filters'] == 1.0 and j['Filters_ref'] == 1.0  # CCO, phenol (x2 valid: 3)
    assert 'ChemNet' in j['not_computed']['FCD']


def test_blank_line_in_the_middle_is_an_invalid_sample(tmp_path):
    s = _write(tmp_path / 's.smi', ['CCO', '', 'CCN'])
    assert M.read_smiles(s, samples=True) == ['CCO', '', 'CCN']
    assert M.read_smiles(s) == ['CCO', 'CCN']


def test_hash_line_is_a_sample_not_a_comment(tmp_path):
    s = _write(tmp_path / 's.smi', ['CCO', '#CC', 'CCN'])
    assert M.read_smiles(s, samples=True) == ['CCO', '#CC', 'CCN']
    assert M.read_smiles(s) == ['CCO', 'CCN']


def test_missing_rdkit_gives_one_line_message(tmp_path):
    fake = tmp_path / 'fake'
    (fake / 'rdkit').mkdir(parents=True)
    (fake / 'rdkit' / '__init__.py').write_text("raise ImportError('no rdkit here')\n")
    s = _write(tmp_path / 's.smi', ['CCO'])
    # the fake rdkit first, then the molgen package this test imported
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(fake), os.path.dirname(os.path.dirname(M.__file__))]))
    p = subprocess.run([sys.executable] + SCRIPT + [s], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and 'RDKit is not available' in lines[0]


def test_missing_file_is_a_clear_error(tmp_path):
    p = subprocess.run([sys.executable] + SCRIPT + [str(tmp_path / 'nope.smi')],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and 'no such file' in p.stderr


# ------------------------------------------------------------------ MOSES Filters
#
# The oracle below is MOSES's mol_passes_filters written out plainly (every
# clause evaluated, every pattern tried on the molecule with hydrogens added,
# no screening); the expected clause of each hand-picked molecule follows
# from the rule, and the oracle confirms that it fails that clause only.

FILTERS_DIR = F.FILTERS_DIR


def _oracle_patterns():
    import csv
    from rdkit import Chem
    with open(os.path.join(FILTERS_DIR, 'mcf.csv'), newline='') as f:
        mcf = list(csv.reader(f))[1:]
    with open(os.path.join(FILTERS_DIR, 'wehi_pains.csv'), newline='') as f:
        pains = list(csv.reader(f))
    return ([('MCF', r[0], Chem.MolFromSmarts(r[1])) for r in mcf]
            + [('PAINS', r[1], Chem.MolFromSmarts(r[0].strip())) for r in pains])


_ORACLE = None


def _oracle_clauses(smi, add_hs=True):
    """Set of the clauses of MOSES's rule that smi fails, and the names of
    the patterns it matches."""
    global _ORACLE
    from rdkit import Chem
    if _ORACLE is None:
        _ORACLE = _oracle_patterns()
    m = Chem.MolFromSmiles(smi)
    out = set()
    if any(len(r) >= 8 for r in m.GetRingInfo().AtomRings()):
        out.add('ring')
    if any(a.GetFormalCharge() != 0 for a in m.GetAtoms()):
        out.add('charge')
    if any(a.GetSymbol() not in ('C', 'N', 'S', 'O', 'F', 'Cl', 'Br', 'H') for a in m.GetAtoms()):
        out.add('element')
    h = Chem.AddHs(m) if add_hs else m
    hits = [(src, name) for src, name, q in _ORACLE if h.HasSubstructMatch(q)]
    out |= set(src for src, _ in hits)
    c = Chem.MolToSmiles(m, isomericSmiles=False)
    if not c or Chem.MolFromSmiles(c) is None:
        out.add('smiles')
    return out, hits


# (SMILES, the clause it fails or None, the pattern named in the verdict)
FILTER_CASES = [
    ('CCO', None, None),
    ('CC(=O)Nc1ccc(S(=O)(=O)NC2CCCCC2)cc1', None, None),  # the main job's molecule
    ('O=C(NCc1ccccc1)C1CCCCCC1', None, None),   # a 7-membered ring is allowed
    ('c1ccc2ccccc2c1', None, None),             # naphthalene: two 6-rings, not a 10-ring
    ('FC(F)(F)c1ccc(Cl)cc1Br', None, None),     # F, Cl, Br are allowed
    ('O=C(NCc1ccccc1)C1CCCCCCC1', 'ring', None),  # the 7-ring case with one more CH2
    ('O=C1CCCCCCCN1', 'ring', None),            # 8-membered lactam
    ('C[N+](C)(C)Cc1ccccc1', 'charge', None),
    ('[O-]C(=O)c1ccccc1', 'charge', None),
    ('O=[N+]([O-])c1ccccc1', 'charge', None),   # nitro groups carry charges in SMILES
    ('OP(O)(=O)Cc1ccccc1', 'element', 'P'),
    ('OB(O)c1ccccc1', 'element', 'B'),
    ('Ic1ccccc1', 'element', 'I'),
    ('O=Cc1ccccc1', 'MCF', 'MCF7'),             # aldehyde [#6&!H0]=[#8]
    ('Clc1ccccn1', 'MCF', 'MCF14'),             # halogen next to a ring heteroatom
    ('ClCc1ccccc1', 'MCF', 'MCF4'),             # [H]C([H])([#6])Cl: needs explicit H
    ('O=C1NC(=S)SC1=Cc1ccccc1', 'PAINS', 'ene_rhod_A(235)'),  # 5-benzylidene rhodanine
    ('O=C1C=CC(=O)C=C1', 'PAINS', 'quinone_A(370)'),
    ('Oc1ccccc1O', 'PAINS', 'catechol_A(92)'),  # the pattern spells out both O-H
    ('Nc1ccc(C=NN)cc1', 'PAINS', 'hzone_anil(14)'),  # every ring H and N-H explicit
    # a molgen sample: RDKit parses it but its canonical SMILES does not parse
    ('CC(=O)Nc1cccc(NC(=O)c2c=n(C)n2C)c1', 'smiles', None),
]

# the patterns that only match once hydrogens are added
NEEDS_HS = {'ClCc1ccccc1', 'Oc1ccccc1O', 'Nc1ccc(C=NN)cc1'}


def test_filter_files_parse_completely():
    from rdkit import Chem
    with open(os.path.join(FILTERS_DIR, 'mcf.csv')) as f:
        mcf_rows = [ln for ln in f.read().splitlines() if ln.strip()][1:]  # minus header
    with open(os.path.join(FILTERS_DIR, 'wehi_pains.csv')) as f:
        pains_rows = [ln for ln in f.read().splitlines() if ln.strip()]
    assert (len(mcf_rows), len(pains_rows)) == (22, 480)
    pats = F.read_filter_smarts(FILTERS_DIR)
    assert len(pats) == len(mcf_rows) + len(pains_rows)
    assert [p[0] for p in pats] == ['MCF'] * 22 + ['PAINS'] * 480
    assert pats[0] == ('MCF', 'MCF1', '[#6]=&!@[#6]-[#6]#[#7]')
    assert pats[22][1] == 'anil_di_alk_F(14)' and pats[-1][1] == 'anil_di_alk_E(186)'
    assert all(s == s.strip() and Chem.MolFromSmarts(s) is not None for _, _, s in pats)
    assert len(F.MosesFilters(FILTERS_DIR).queries) == 502


def test_filter_files_are_the_documented_copies():
    import hashlib
    readme = open(os.path.join(FILTERS_DIR, 'README.md')).read()
    for name in ('mcf.csv', 'wehi_pains.csv'):
        with open(os.path.join(FILTERS_DIR, name), 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        assert '`%s` | ' % name in readme and digest in readme, name


@pytest.mark.parametrize('smi,clause,detail', FILTER_CASES)
def test_filters_verdict_of_hand_picked_molecules(smi, clause, detail):
    from rdkit import Chem
    failing, hits = _oracle_clauses(smi)
    assert failing == ({clause} if clause else set())
    v = F.MosesFilters(FILTERS_DIR).failure(Chem.MolFromSmiles(smi))
    if clause is None:
        assert v is None
    else:
        assert v is not None and v[0] == clause
        if clause in ('MCF', 'PAINS'):
            assert v[1] == detail and (clause, detail) == (hits[0][0], hits[0][1][7:-1]
                                                            if clause == 'PAINS' else hits[0][1])
        elif detail is not None:
            assert v[1] == detail


@pytest.mark.parametrize('smi', sorted(NEEDS_HS))
def test_filters_match_with_hydrogens_added(smi):
    # without explicit hydrogens no pattern matches: the verdict depends on AddHs
    assert _oracle_clauses(smi, add_hs=False) == (set(), [])
    assert _oracle_clauses(smi)[0] in ({'MCF'}, {'PAINS'})


def test_filters_clause_order_is_moses():
    from rdkit import Chem
    # charged and a PAINS hit (a real ZINC molecule): the charge is reported first
    smi = r'Cc1ccc(/C=C2\SC(N3CC[NH2+]CC3)=NC2=O)cc1'
    assert _oracle_clauses(smi)[0] == {'charge', 'PAINS'}
    assert F.MosesFilters(FILTERS_DIR).failure(Chem.MolFromSmiles(smi))[0] == 'charge'


def test_query_requirements():
    from rdkit import Chem

    def atom(sm):
        return F._required_atom(Chem.MolFromSmarts(sm).GetAtomWithIdx(0))

    def bond(sm):
        return F._required_bond(Chem.MolFromSmarts(sm).GetBondWithIdx(0))

    assert atom('[#6;X4]') == (6, None)
    assert atom('c') == (6, 1006) and atom('C') == (6, 6) and atom('n') == (7, 1007)
    assert atom('[H]') == (1, None) and atom('[#1]') == (1, None)
    assert atom('[c;!H0,$(c-[#7])]') == (6, 1006)
    assert atom('[#6&!H0&!H1]') == (6, None)  # nested AND
    # RDKit's parser gives this atom no atomic number: no requirement (conservative)
    assert Chem.MolFromSmarts('[!#6&#7]').GetAtomWithIdx(0).GetAtomicNum() == 0
    assert atom('[!#6&#7]') is None
    for sm in ('[C,N]', '[#6,#7]', '[!#6]', '[!C]', '*', '[$(C)]', '[!#1!#6]', '[#6&#7]',
               '[#7&H2,$([#7;!H0]-[#6;X4])]', '[F,Cl,Br,I]'):
        assert atom(sm) is None, sm
    assert bond('C=O') == (6, 8, 2) and bond('O=C') == (6, 8, 2)
    assert bond('c:c') == (6, 6, 12) and bond('C#N') == (6, 7, 3)
    assert bond('C=&!@C') == (6, 6, 2)
    assert bond('[#6]-[#1]') == (1, 6, 1)
    for sm in ('C~O', 'C-,:O', 'CC', '[C,N]=O', 'C!=O'):
        assert bond(sm) is None, sm


def test_screen_never_skips_a_matching_pattern():
    from rdkit import Chem
    f = F.MosesFilters(FILTERS_DIR)
    data = os.path.join(HERE, '..', '..', '..', 'data', 'moses_20k.smi')
    smiles = [s for s, _, _ in FILTER_CASES] + M.read_smiles(data)[:150] + [
        r'Cc1ccc(/C=C2\SC(N3CC[NH2+]CC3)=NC2=O)cc1', 'c1cc[n+](C)cc1', 'O=C(O)c1ccc(O)c(O)c1',
        'N#CC(C#N)=Cc1ccccc1', 'CC(=O)C(C)=NNc1ccccc1', 'Oc1c(O)cc2ccccc2c1', 'S=C(N)Nc1ccccc1',
        # one molecule per MCF pattern where a small one exists, and classic PAINS
        'C=CC#N', 'C=CS(C)(=O)=O', 'C=CC(=O)NC', 'CC1CO1', 'CN=C=O', 'CC1CN1', 'CN=NC', 'CSSC',
        'NCN', 'CC(O)O', 'BrCC(Br)CBr', 'ClC(Cl)C(Cl)Cl', 'FC(F)(F)C(F)(F)C(F)(F)F',
        'CN(C)c1ccc(C=C2C(=O)NC(=O)NC2=O)cc1', 'c1ccc(N=Nc2ccccc2)cc1', 'CN(C)c1ccc(C)cc1',
        'Oc1ccc(N)cc1', 'O=C(C=Cc1ccccc1)c1ccccc1', 'Nc1sccc1C(=O)O']
    hits = 0
    for smi in smiles:
        h = Chem.AddHs(Chem.MolFromSmiles(smi))
        cand = set(f.candidates(h).tolist())
        for p, q in enumerate(f.queries):
            if h.HasSubstructMatch(q):
                hits += 1
                assert p in cand, (smi, f.patterns[p][1])
    assert hits >= 30  # the check saw real matches, not only passing molecules


def test_filters_in_compute_metrics():
    odd = 'CC(=O)Nc1cccc(NC(=O)c2c=n(C)n2C)c1'
    samples = ['CCO', 'O=Cc1ccccc1', 'C1CC', 'ClCc1ccccc1', odd, 'CCO', 'c1ccccc1']
    ref = ['CCO', 'O=Cc1ccccc1', 'CCN', 'not a smiles']
    r = M.compute_metrics(samples, ['CCCC'], ref, jobs=1)
    # 6 valid; pass: CCO twice and benzene; MCF: the aldehyde and benzyl
    # chloride; the odd one's canonical SMILES does not parse again
    assert r['n_valid'] == 6
    assert r['Filters'] == pytest.approx(3 / 6)
    assert r['filters_failures'] == {'MCF': 2, 'smiles': 1}
    # reference: 3 molecules parse, the aldehyde fails
    assert r['Filters_ref'] == pytest.approx(2 / 3) and r['n_ref_filters'] == 3
    assert r['FCD'] is None and 'ChemNet' in r['not_computed']['FCD']
    table = M.format_table(r)
    assert 'Filters     0.5000  (3 / 6 valid pass; fail: MCF 2, smiles 1; reference 0.6667 of 3)' \
        in table
    assert 'FCD         not computed: ' in table
    r = M.compute_metrics(samples, ['CCCC'], ref, jobs=1, ref_filters=False)
    assert r['Filters'] == pytest.approx(3 / 6) and r['Filters_ref'] is None
    assert 'reference' not in M._fmt_filters(r)


def test_filters_on_moses_molecules_is_one():
    # MOSES's dataset was built from molecules that pass the filters
    data = os.path.join(HERE, '..', '..', '..', 'data', 'moses_20k.smi')
    r = M.compute_metrics(M.read_smiles(data)[:300], None, None, jobs=1)
    assert r['n_valid'] == 300 and r['Filters'] == 1.0


def test_filter_data_errors_are_clear(tmp_path):
    with pytest.raises(M.FilterDataError, match='cannot read .*mcf.csv'):
        F.MosesFilters(str(tmp_path))
    (tmp_path / 'mcf.csv').write_text('names,smarts\nX1,[#6]=[#8]\n')
    (tmp_path / 'wehi_pains.csv').write_text('"c1ccccc1","<regId=ok(1)>"\n"[#6","<regId=bad(1)>"\n')
    with pytest.raises(M.FilterDataError, match='PAINS pattern bad\\(1\\) does not parse'):
        F.MosesFilters(str(tmp_path))
    (tmp_path / 'wehi_pains.csv').write_text('"c1ccccc1"\n')
    with pytest.raises(M.FilterDataError, match='wehi_pains.csv:1: expected 2'):
        F.MosesFilters(str(tmp_path))
    (tmp_path / 'mcf.csv').write_text('X1,[#6]=[#8]\n')
    with pytest.raises(M.FilterDataError, match="header 'names,smarts'"):
        F.MosesFilters(str(tmp_path))
    (tmp_path / 'mcf.csv').write_bytes(b'names,smarts\nX1,\xff\xfe\n')
    with pytest.raises(M.FilterDataError, match='not a UTF-8 CSV file'):
        F.MosesFilters(str(tmp_path))


def test_missing_filter_files_say_not_computed(tmp_path, monkeypatch):
    monkeypatch.setattr(F, 'FILTERS_DIR', str(tmp_path))
    monkeypatch.setattr(F, '_DEFAULT', None)
    r = M.compute_metrics(['CCO'], None, None, jobs=1)
    assert r['Filters'] is None and 'cannot read' in r['not_computed']['Filters']
    assert any(n.startswith('Filters not computed: cannot read') for n in r['notes'])
    assert r['validity'] == 1.0


def test_sampling_sidecar_is_reported(tmp_path):
    """molgen sample's SAMPLES.json (its constrain mode) is printed and kept
    in the JSON; without it the output says the mode is unknown."""
    s = _write(tmp_path / 's.smi', ['CCO', 'c1ccccc1O'])
    for meta in (None, {'constrain': 'valence', 'temperature': 1.0, 'top_k': 0, 'top_p': 1.0,
                        'seed': '7', 'model': 'm.safetensors'}):
        side = tmp_path / 's.smi.json'
        if meta:
            side.write_text(json.dumps(meta))
        out = tmp_path / 'm.json'
        p = subprocess.run([sys.executable] + SCRIPT + [s, '--json', str(out), '--jobs', '1', '-q'],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        j = json.loads(out.read_text())
        line = [l for l in p.stdout.splitlines() if l.startswith('sampling')][0]
        if meta:
            assert j['sampling'] == meta and 'constrain valence' in line
        else:
            assert j['sampling'] is None and 'unknown' in line
