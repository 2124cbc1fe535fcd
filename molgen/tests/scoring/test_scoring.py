"""Tests of molgen.scoring (the scorer of `molgen optimize`): the modifiers
against values worked out by hand from their formulas, the PMO oracles on
molecules whose scores follow from the definitions (a target against itself,
true isomers, the reference drugs recomputed component by component from
RDKit's descriptors, published TDC scores of a ZINC molecule), and the server
protocol through a subprocess. Run with /usr/bin/python3 -m pytest (RDKit)."""
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip('rdkit')
from rdkit import Chem, DataStructs  # noqa: E402
from rdkit.Chem.Scaffolds import MurckoScaffold  # noqa: E402
from rdkit.Chem import AllChem, Descriptors, QED, rdMolDescriptors  # noqa: E402

import molgen.scoring as S  # noqa: E402
from molgen.scoring import modifiers as MOD  # noqa: E402

E = math.exp
PY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(S.__file__))))
ENV = dict(os.environ, PYTHONPATH=PY)

OSIMERTINIB = 'COc1cc(N(C)CCN(C)C)c(NC(=O)C=C)cc1Nc2nccc(n2)c3cn(C)c4ccccc34'
FEXOFENADINE = 'CC(C)(C(=O)O)c1ccc(cc1)C(O)CCCN2CCC(CC2)C(O)(c3ccccc3)c4ccccc4'
RANOLAZINE = 'COc1ccccc1OCC(O)CN2CCN(CC(=O)Nc3c(C)cccc3C)CC2'
PERINDOPRIL = 'O=C(OCC)C(NC(C(=O)N1C(C(=O)O)CC2CCCCC12)C)CCC'
AMLODIPINE = 'Clc1ccccc1C2C(=C(/N/C(=C2/C(=O)OCC)COCCN)C)\\C(=O)OC'
ZALEPLON = 'O=C(C)N(CC)C1=CC=CC(C2=CC=NC3=C(C=NN23)C#N)=C1'
SITAGLIPTIN = 'Fc1cc(c(F)cc1F)CC(N)CC(=O)N3Cc2nnc(n2CC3)C(F)(F)F'
VALSARTAN = 'CCCCC(=O)N(Cc1ccc(-c2ccccc2-c2nn[nH]n2)cc1)[C@@H](C(=O)O)C(C)C'
HOP_REF = 'CCCOc1cc2ncnc(Nc3ccc4ncsc4c3)c2cc1S(=O)(=O)C(C)(C)C'
CAMPHOR, MENTHOL = 'CC1(C)C2CCC1(C)C(=O)C2', 'CC(C)C1CCC(C)CC1O'


def task(name, smiles):
    return S.load('pmo/' + name).score(smiles).score


def mod(table):
    return MOD.make_modifier(table, 'test')


# ------------------------------------------------------------------ modifiers

def test_gaussian_family():
    g = mod({'kind': 'gaussian', 'mu': 2, 'sigma': 0.5})
    assert g(2) == 1.0 and g(3) == pytest.approx(E(-2), rel=1e-15) and g(1) == g(3)
    lo = mod({'kind': 'min_gaussian', 'mu': 1, 'sigma': 1})   # smaller is better
    assert lo(0.5) == 1.0 and lo(-10) == 1.0 and lo(3) == pytest.approx(E(-2), rel=1e-15)
    hi = mod({'kind': 'max_gaussian', 'mu': 100, 'sigma': 10})  # larger is better
    assert hi(120) == 1.0 and hi(80) == pytest.approx(E(-2), rel=1e-15)


def test_clipped_and_threshold():
    c = mod({'kind': 'clipped', 'upper_x': 0.8})
    assert c(0.4) == pytest.approx(0.5) and c(0.9) == 1.0 and c(-0.1) == 0.0 and c(0.8) == 1.0
    down = mod({'kind': 'clipped', 'upper_x': 0, 'lower_x': 1})  # decreasing
    assert down(0.25) == pytest.approx(0.75) and down(2) == 0.0 and down(-1) == 1.0
    band = mod({'kind': 'clipped', 'upper_x': 10, 'lower_x': 0, 'high_score': 0.9,
                'low_score': 0.1})
    assert band(5) == pytest.approx(0.5) and band(20) == 0.9 and band(-3) == 0.1
    t = mod({'kind': 'threshold', 'threshold': 4})
    assert t(2) == 0.5 and t(6) == 1.0


def test_reinvent_sigmoids():
    s = mod({'kind': 'sigmoid', 'low': 0, 'high': 10, 'k': 0.5})
    r = mod({'kind': 'reverse_sigmoid', 'low': 0, 'high': 10, 'k': 0.5})
    # z = 10 k (x - 5) / 10 = 0.5 (x - 5); sigmoid = 1 / (1 + 10^-z)
    assert s(5) == pytest.approx(0.5) and s(7) == pytest.approx(10 / 11) and s(3) == pytest.approx(1 / 11)
    assert r(7) == pytest.approx(1 / 11) and r(3) == pytest.approx(10 / 11)
    steep = mod({'kind': 'sigmoid', 'low': 0, 'high': 1, 'k': 100})
    assert steep(1000) == 1.0 and steep(-1000) == 0.0  # no overflow
    d = mod({'kind': 'double_sigmoid', 'low': 2, 'high': 6, 'coef_div': 1, 'coef_si': 1,
             'coef_se': 1})
    # 1 / (1 + 10^(low - x)) - 1 / (1 + 10^(high - x))
    assert d(4) == pytest.approx(100 / 101 - 1 / 101)
    assert d(3) == pytest.approx(10 / 11 - 1 / 1001)
    dd = mod({'kind': 'double_sigmoid', 'low': 2, 'high': 6})  # REINVENT's defaults 100, 150, 150
    assert dd(4) == pytest.approx(1 / (1 + 10 ** -3) - 1 / (1 + 10 ** 3))
    st = mod({'kind': 'step', 'low': 2, 'high': 4})
    assert [st(x) for x in (1.99, 2, 3, 4, 4.01)] == [0, 1, 1, 1, 0]


@pytest.mark.parametrize('table, says', [
    ({'kind': 'gauss', 'mu': 0, 'sigma': 1}, "modifier kind 'gauss' is not one of"),
    ({'kind': 'gaussian', 'mu': 0}, "needs 'sigma'"),
    ({'kind': 'gaussian', 'mu': 0, 'sigma': 0}, 'sigma must be > 0'),
    ({'kind': 'gaussian', 'mu': 0, 'sigma': 1, 'k': 2}, "has no parameter 'k'"),
    ({'kind': 'clipped', 'upper_x': 'high'}, 'must be a finite number'),
    ({'kind': 'clipped', 'upper_x': 0}, 'upper_x and lower_x must differ'),
    ({'kind': 'sigmoid', 'low': 3, 'high': 1, 'k': 1}, 'need low < high'),
])
def test_bad_modifier_is_named(table, says):
    with pytest.raises(MOD.ConfigError, match=says):
        mod(table)


# ------------------------------------------------------------------ components

@pytest.mark.parametrize('fp', ['ECFP4', 'ECFP6', 'FCFP4', 'FCFP6', 'AP', 'PHCO'])
def test_similarity_of_a_target_with_itself_is_1(fp):
    sc = S.Scorer({'component': [{'kind': 'similarity', 'target': OSIMERTINIB,
                                  'fingerprint': fp}]})
    assert sc(OSIMERTINIB) == 1.0
    assert sc(Chem.MolToSmiles(Chem.MolFromSmiles(OSIMERTINIB), doRandom=True)) == 1.0
    assert sc('CCO') < 0.2


def test_similarity_is_tanimoto_of_morgan_counts():
    # ECFP4 counts: Tanimoto = sum(min) / sum(max) over the count vectors
    a, b = 'CCOc1ccccc1', 'CCOc1ccccc1C'
    va = AllChem.GetMorganFingerprint(Chem.MolFromSmiles(a), 2).GetNonzeroElements()
    vb = AllChem.GetMorganFingerprint(Chem.MolFromSmiles(b), 2).GetNonzeroElements()
    keys = set(va) | set(vb)
    want = (sum(min(va.get(k, 0), vb.get(k, 0)) for k in keys)
            / sum(max(va.get(k, 0), vb.get(k, 0)) for k in keys))
    sc = S.Scorer({'component': [{'kind': 'similarity', 'target': a}]})
    assert sc(b) == pytest.approx(want, rel=1e-12)
    two = S.Scorer({'component': [{'kind': 'similarity', 'targets': [a, 'CCCCCC'],
                                   'reduce': 'mean'}]})
    assert two(a) == pytest.approx((1 + sc('CCCCCC')) / 2)


def test_descriptor_components_and_aggregation():
    m = Chem.MolFromSmiles('CC(=O)Oc1ccccc1C(=O)O')  # aspirin
    lin = {'kind': 'clipped', 'upper_x': 1000, 'lower_x': -1000}  # x -> (x + 1000) / 2000
    kinds = {'logp': Descriptors.MolLogP(m), 'tpsa': Descriptors.TPSA(m),
             'mw': Descriptors.MolWt(m), 'hbd': rdMolDescriptors.CalcNumHBD(m),
             'hba': rdMolDescriptors.CalcNumHBA(m),
             'rotatable_bonds': rdMolDescriptors.CalcNumRotatableBonds(m),
             'rings': 1, 'aromatic_rings': 1, 'formal_charge': 0, 'heavy_atoms': 13,
             'bertz': Descriptors.BertzCT(m)}
    sc = S.Scorer({'component': [{'kind': k, 'modifier': lin} for k in kinds]})
    r = sc.score('CC(=O)Oc1ccccc1C(=O)O')
    got = dict(r.components)
    for k, v in kinds.items():
        assert got[k + '_raw'] == pytest.approx(v, rel=1e-12), k
        assert got[k] == pytest.approx((v + 1000) / 2000, rel=1e-12), k
    assert got['hbd_raw'] == 1 and got['hba_raw'] == 3 and got['rotatable_bonds_raw'] == 2
    charged = S.Scorer({'component': [{'kind': 'formal_charge', 'modifier': lin}]})
    assert dict(charged.score('C[N+](C)(C)C.[Cl-].[Na+]').components)['formal_charge_raw'] == 1
    # weighted means of qed and a SMARTS: hand-made from the two values
    q = QED.qed(m)
    arith = S.Scorer({'aggregate': 'arithmetic', 'component': [
        {'kind': 'qed', 'weight': 3}, {'kind': 'smarts', 'pattern': 'C(=O)O', 'weight': 1},
        {'kind': 'smarts', 'pattern': '[#7]', 'name': 'N', 'weight': 1}]})
    assert arith(Chem.MolToSmiles(m)) == pytest.approx((3 * q + 1 + 0) / 5)
    geo = S.Scorer({'component': [{'kind': 'qed', 'weight': 3},
                                  {'kind': 'similarity', 'target': 'c1ccccc1O', 'weight': 1}]})
    s = DataStructs.TanimotoSimilarity(AllChem.GetMorganFingerprint(m, 2),
                                       AllChem.GetMorganFingerprint(Chem.MolFromSmiles('c1ccccc1O'), 2))
    assert geo('CC(=O)Oc1ccccc1C(=O)O') == pytest.approx((q ** 3 * s) ** 0.25, rel=1e-12)
    arith_n = S.Scorer({'component': [{'kind': 'qed'}, {'kind': 'smarts', 'pattern': '[#7]'}]})
    assert arith_n('CCO') == 0.0  # geometric mean with a zero


def test_sa_filters_and_alerts():
    from molgen.props import sascorer
    m = Chem.MolFromSmiles('CC(=O)Oc1ccccc1C(=O)O')
    sa = S.Scorer({'component': [{'kind': 'sa', 'modifier': {'kind': 'clipped', 'upper_x': 1,
                                                               'lower_x': 10}}]})
    r = dict(sa.score('CC(=O)Oc1ccccc1C(=O)O').components)
    assert r['sa_raw'] == pytest.approx(sascorer().calculateScore(m), rel=1e-12)
    assert r['sa'] == pytest.approx((10 - r['sa_raw']) / 9, rel=1e-12)
    f = S.Scorer({'component': [{'kind': 'moses_filters'}]})
    # MOSES's rules: no charge, no 8+ membered ring, only C N S O F Cl Br H
    assert f('CCOc1ccccc1') == 1.0
    assert f('C[N+](C)(C)C') == 0.0 and f('C1CCCCCCC1') == 0.0 and f('CCP') == 0.0
    a = S.Scorer({'component': [{'kind': 'alerts', 'smarts': ['[N+](=O)[O-]', 'C(=O)Cl']}]})
    assert a('c1ccccc1') == 1.0 and a('O=[N+]([O-])c1ccccc1') == 0.0 and a('CC(=O)Cl') == 0.0
    forbid = S.Scorer({'component': [{'kind': 'smarts', 'pattern': 'c1ccccc1', 'forbidden': True}]})
    assert forbid('c1ccccc1C') == 0.0 and forbid('CCCC') == 1.0


def test_isomer_score_by_hand():
    iso = S.Scorer({'component': [{'kind': 'isomer', 'formula': 'C7H8N2O2'}]})
    for s in ('Nc1ccc(C(N)=O)c(O)c1', 'Cc1ccc([N+](=O)[O-])cc1N', 'NC(=O)c1ccccc1NO'):
        assert rdMolDescriptors.CalcMolFormula(Chem.MolFromSmiles(s)) == 'C7H8N2O2'
        assert iso(s) == 1.0
    # toluene C7H8: C and H right (1, 1), N and O off by 2 (e^-2 each), 15 atoms for 19
    # (Gaussian sigma 2: e^-2): geometric mean of five
    assert iso('Cc1ccccc1') == pytest.approx(E(-6 / 5), rel=1e-12)
    ar = S.Scorer({'component': [{'kind': 'isomer', 'formula': 'C7H8N2O2', 'mean': 'arithmetic'}]})
    assert ar('Cc1ccccc1') == pytest.approx((2 + 3 * E(-2)) / 5, rel=1e-12)


# ------------------------------------------------------------------ PMO oracles

def test_the_20_pmo_tasks_are_shipped():
    assert S.pmo_tasks() == sorted([
        'albuterol_similarity', 'amlodipine_mpo', 'celecoxib_rediscovery', 'deco_hop',
        'fexofenadine_mpo', 'isomers_c7h8n2o2', 'isomers_c9h10n2o2pf2cl', 'median1', 'median2',
        'mestranol_similarity', 'osimertinib_mpo', 'perindopril_mpo', 'qed', 'ranolazine_mpo',
        'scaffold_hop', 'sitagliptin_mpo', 'thiothixene_rediscovery', 'troglitazone_rediscovery',
        'valsartan_smarts', 'zaleplon_mpo'])


@pytest.mark.parametrize('name, target', [
    ('celecoxib_rediscovery', 'CC1=CC=C(C=C1)C1=CC(=NN1C1=CC=C(C=C1)S(N)(=O)=O)C(F)(F)F'),
    ('troglitazone_rediscovery', 'Cc1c(C)c2OC(C)(COc3ccc(CC4SC(=O)NC4=O)cc3)CCc2c(C)c1O'),
    ('thiothixene_rediscovery', 'CN(C)S(=O)(=O)c1ccc2Sc3ccccc3C(=CCCN4CCN(C)CC4)c2c1'),
    ('albuterol_similarity', 'CC(C)(C)NCC(O)c1ccc(O)c(CO)c1'),
    ('mestranol_similarity', 'COc1ccc2[C@H]3CC[C@@]4(C)[C@@H](CC[C@@]4(O)C#C)[C@@H]3CCc2c1'),
])
def test_rediscovery_and_similarity_score_their_target_1(name, target):
    assert task(name, target) == 1.0
    assert task(name, 'CCO') < 0.5


def test_isomer_tasks():
    assert task('isomers_c7h8n2o2', 'Nc1ccc(C(N)=O)c(O)c1') == 1.0
    p = 'NC(=O)c1ccc(Cl)cc1CCNP(F)(F)=O'
    assert rdMolDescriptors.CalcMolFormula(Chem.MolFromSmiles(p)) == 'C9H10ClF2N2O2P'
    assert task('isomers_c9h10n2o2pf2cl', p) == 1.0
    # toluene for C9H10N2O2PF2Cl: C, H, N, O, F off by 2 (e^-2 each), P, Cl by 1
    # (e^-0.5), 15 atoms for 27 (e^-18): geometric mean of eight
    assert task('isomers_c9h10n2o2pf2cl', 'Cc1ccccc1') == pytest.approx(E(-29 / 8), rel=1e-12)
    assert task('isomers_c7h8n2o2', 'Cc1ccccc1') == pytest.approx(E(-6 / 5), rel=1e-12)


def test_qed_task_is_rdkit_qed():
    for s in ('CC(=O)Oc1ccccc1C(=O)O', 'Cn1cnc2c1c(=O)n(C)c(=O)n2C', OSIMERTINIB):
        assert task('qed', s) == QED.qed(Chem.MolFromSmiles(s))


def _d(s):
    m = Chem.MolFromSmiles(s)
    return Descriptors.TPSA(m), Descriptors.MolLogP(m)


def _gm(*xs):
    return math.prod(xs) ** (1 / len(xs))


def test_mpo_tasks_on_their_reference_drug():
    # each: the geometric mean of the components, worked out from the
    # definition with the similarity to itself = 1
    tpsa, logp = _d(OSIMERTINIB)
    want = _gm(1.0, E(-0.5 * (0.15 / 0.1) ** 2),                 # ECFP6 1 > mu 0.85
               E(-0.5 * ((min(tpsa, 100) - 100) / 10) ** 2),
               E(-0.5 * (max(logp, 1) - 1) ** 2))
    assert task('osimertinib_mpo', OSIMERTINIB) == pytest.approx(want, rel=1e-12)
    tpsa, logp = _d(FEXOFENADINE)
    want = _gm(1.0, E(-0.5 * ((min(tpsa, 90) - 90) / 10) ** 2), E(-0.5 * (max(logp, 4) - 4) ** 2))
    assert task('fexofenadine_mpo', FEXOFENADINE) == pytest.approx(want, rel=1e-12)
    tpsa, logp = _d(RANOLAZINE)
    want = _gm(1.0, E(-0.5 * ((min(tpsa, 95) - 95) / 20) ** 2),
               E(-0.5 * (min(logp, 7) - 7) ** 2), E(-0.5))           # no fluorine: 0 for mu 1
    assert task('ranolazine_mpo', RANOLAZINE) == pytest.approx(want, rel=1e-12)
    # perindopril has no aromatic ring: Gaussian (2, 0.5) of 0 = e^-8
    assert task('perindopril_mpo', PERINDOPRIL) == pytest.approx(E(-4), rel=1e-12)
    # amlodipine has 2 rings (chlorophenyl, dihydropyridine): Gaussian (3, 0.5) of 2 = e^-2
    assert rdMolDescriptors.CalcNumRings(Chem.MolFromSmiles(AMLODIPINE)) == 2
    assert task('amlodipine_mpo', AMLODIPINE) == pytest.approx(E(-1), rel=1e-12)
    # zaleplon is C17H15N5O, for C19H17N3O2: C, H, N off by 2, O by 1, 38 atoms for 41
    iso = E(-(2 + 2 + 2 + 0.5 + 0.5 * (3 / 2) ** 2) / 5)
    assert task('zaleplon_mpo', ZALEPLON) == pytest.approx(math.sqrt(iso), rel=1e-12)
    # sitagliptin: its own logP, TPSA and formula (1, 1, 1), similarity 1 under
    # a Gaussian (0, 0.1): e^-50
    assert task('sitagliptin_mpo', SITAGLIPTIN) == pytest.approx(E(-50 / 4), rel=1e-9)
    s = S.load('pmo/median1').score(CAMPHOR)
    sim_m = DataStructs.TanimotoSimilarity(
        AllChem.GetMorganFingerprint(Chem.MolFromSmiles(CAMPHOR), 2),
        AllChem.GetMorganFingerprint(Chem.MolFromSmiles(MENTHOL), 2))
    assert s.score == pytest.approx(math.sqrt(sim_m), rel=1e-12)


def test_valsartan_smarts():
    sita = Chem.MolFromSmiles(SITAGLIPTIN)
    m = Chem.MolFromSmiles(VALSARTAN)
    want = _gm(1.0, E(-0.5 * ((Descriptors.TPSA(m) - Descriptors.TPSA(sita)) / 5) ** 2),
               E(-0.5 * ((Descriptors.MolLogP(m) - Descriptors.MolLogP(sita)) / 0.2) ** 2),
               E(-0.5 * ((Descriptors.BertzCT(m) - Descriptors.BertzCT(sita)) / 30) ** 2))
    assert task('valsartan_smarts', VALSARTAN) == pytest.approx(want, rel=1e-9)
    # sitagliptin has sitagliptin's properties but not the SMARTS: 0
    assert task('valsartan_smarts', SITAGLIPTIN) == 0.0
    r = dict(S.load('pmo/valsartan_smarts').score(SITAGLIPTIN).components)
    assert r['valsartan_smarts'] == 0.0 and r['logp'] == pytest.approx(1.0) and r['tpsa'] == pytest.approx(1.0)


def test_hop_tasks_on_their_reference():
    # deco_hop: PHCO similarity 1 (clipped: 1), both forbidden decorations
    # present (0, 0), the scaffold present (1): mean 1/2
    r = dict(S.load('pmo/deco_hop').score(HOP_REF).components)
    assert (r['sim_phco'], r['no_sulfone'], r['no_benzothiazole_amine'], r['scaffold']) == (1, 0, 0, 1)
    assert task('deco_hop', HOP_REF) == 0.5
    # scaffold_hop: similarity 1, the decoration present (1), the scaffold forbidden (0)
    assert task('scaffold_hop', HOP_REF) == pytest.approx(2 / 3)


# published TDC oracle scores (rounded to 6 digits) of a ZINC molecule, from
# the MolGen/ZINC_250K_prop_train_val_split dataset (Hugging Face), computed
# with PyTDC's oracles
ZINC_MOL = 'CC[C@@H]1CCCC[C@H]1c1noc(-c2cn3c(n2)COCC3)n1'


@pytest.mark.parametrize('name, value', [('albuterol_similarity', 0.194444),
                                         ('amlodipine_mpo', 0.095698),
                                         ('celecoxib_rediscovery', 0.0625),
                                         ('deco_hop', 0.524572)])
def test_published_tdc_scores(name, value):
    assert task(name, ZINC_MOL) == pytest.approx(value, abs=5e-7)


def test_every_task_scores_in_unit_interval_and_nan_for_invalid():
    mols = ['CCO', 'c1ccccc1', OSIMERTINIB, VALSARTAN, 'C[N+](C)(C)C', 'CCP(=O)(O)O']
    for t in S.pmo_tasks():
        got = S.score_smiles('pmo/' + t, mols + ['C1CC', ''])
        assert all(0.0 <= v <= 1.0 for v in got[:-2]), (t, got)
        assert math.isnan(got[-2]) and math.isnan(got[-1])


# ------------------------------------------------------------------ config errors

def _cfg(tmp_path, text, name='c.toml'):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _serve(args, stdin='', timeout=120):
    return subprocess.run([sys.executable, '-m', 'molgen.scoring'] + args, input=stdin,
                          capture_output=True, text=True, env=ENV, timeout=timeout)


@pytest.mark.parametrize('text, says', [
    ('kind = "qed"\n[[component]\n', 'not valid TOML'),
    ('aggregate = "median"\n[[component]]\nkind = "qed"\n', "aggregate 'median'"),
    ('[[component]]\nkind = "logp"\n', 'give it a modifier'),
    ('[[component]]\nkind = "qde"\n', "kind 'qde' is not one of"),
    ('[[component]]\nkind = "similarity"\ntarget = "C1CC"\n', "'C1CC' is not a SMILES"),
    ('[[component]]\nkind = "similarity"\ntarget = "CCO"\nfingerprint = "MACCS"\n',
     "fingerprint 'MACCS'"),
    ('[[component]]\nkind = "smarts"\npattern = "[C"\n', 'is not a SMARTS'),
    ('[[component]]\nkind = "isomer"\nformula = "C7Xx2"\n', "'Xx' is not an element"),
    ('[[component]]\nkind = "qed"\nweight = -1\n', 'weight must be a number > 0'),
    ('[[component]]\nkind = "qed"\ncolour = 1\n', "has no key 'colour'"),
    ('[[component]]\nkind = "tpsa"\nmodifier = {kind = "gaussian", mu = 1}\n', "needs 'sigma'"),
    ('name = "x"\n', 'no [[component]] table'),
])
def test_bad_config_is_exit_2_with_one_line(tmp_path, text, says):
    p = _serve([_cfg(tmp_path, text)])
    assert p.returncode == 2 and p.stdout == ''
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('molgen.scoring: ') and says in lines[0], p.stderr


def test_missing_file_and_unknown_task(tmp_path):
    p = _serve([str(tmp_path / 'none.toml')])
    assert p.returncode == 2 and 'cannot read' in p.stderr
    p = _serve(['--task', 'pmo/drd2'])
    assert p.returncode == 2 and "no task 'pmo/drd2'" in p.stderr and 'zaleplon_mpo' in p.stderr
    p = _serve([])
    assert p.returncode == 2 and 'give one of' in p.stderr


# ------------------------------------------------------------------ the server

def test_server_protocol_round_trip(tmp_path):
    cfg = _cfg(tmp_path, '''
aggregate = "arithmetic"
[[component]]
kind = "qed"
weight = 2
[[component]]
kind = "tpsa"
modifier = { kind = "clipped", upper_x = 0, lower_x = 200 }
''')
    reqs = ['OCC', 'C1CC', '', 'not a smiles', 'CC(=O)Oc1ccccc1C(=O)O name-ignored',
            'F/C=C/F']
    p = _serve([cfg], ''.join(r + '\n' for r in reqs))
    assert p.returncode == 0, p.stderr
    out = p.stdout.split('\n')
    assert out[-1] == '' and len(out) == len(reqs) + 1
    assert out[1:4] == ['nan', 'nan', 'nan']
    for i, smi in ((0, 'OCC'), (4, 'CC(=O)Oc1ccccc1C(=O)O'), (5, 'F/C=C/F')):
        f = out[i].split('\t')
        m = Chem.MolFromSmiles(smi)
        q, t = QED.qed(m), Descriptors.TPSA(m)
        assert 'e' not in f[0] and float(f[0]) == pytest.approx((2 * q + (200 - t) / 200) / 3, rel=1e-12)
        kv = dict(x.split('=', 1) for x in f[1:])
        assert kv['canonical'] == Chem.MolToSmiles(m)
        assert float(kv['qed']) == pytest.approx(q, rel=1e-12)
        assert float(kv['tpsa_raw']) == pytest.approx(t, rel=1e-12)
        assert list(kv) == ['canonical', 'scaffold', 'qed', 'tpsa', 'tpsa_raw']
        assert kv['scaffold'] == Chem.MolToSmiles(MurckoScaffold.GetScaffoldForMol(m))
    assert out[4].split('\t')[2] == 'scaffold=c1ccccc1'  # aspirin's Murcko scaffold
    assert out[0].split('\t')[2] == 'scaffold='  # acyclic: an empty scaffold
    assert out[5].split('\t')[1] == 'canonical=F/C=C/F'  # isomeric, as PMO's key


def test_server_answers_each_line_before_the_next_is_sent():
    # molgen writes a batch and waits: the reply to line 1 must come before line 2 exists
    p = subprocess.Popen([sys.executable, '-m', 'molgen.scoring', '--task', 'pmo/qed'],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV)
    try:
        for s in ('CCO', 'C1CC', 'c1ccccc1'):
            p.stdin.write((s + '\n').encode())
            p.stdin.flush()
            line = p.stdout.readline().decode().rstrip('\n')
            if s == 'C1CC':
                assert line == 'nan'
            else:
                assert float(line.split('\t')[0]) == pytest.approx(QED.qed(Chem.MolFromSmiles(s)))
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()


def test_randomize_is_deterministic_and_parses_back():
    mol = 'CC(=O)Oc1ccccc1C(=O)O'
    reqs = '!randomize\t42\t5\t%s\n!randomize\t42\t5\t%s\n!randomize\t7\t5\t%s\n' \
           '!randomize\t1\t3\tC1CC\n!randomize\tx\t3\tCCO\nCCO\n' % (mol, mol, mol)
    a = _serve(['--task', 'pmo/qed'], reqs)
    b = _serve(['--task', 'pmo/qed'], reqs)
    assert a.returncode == 0 and a.stdout == b.stdout  # same seed, same output, across runs
    out = a.stdout.split('\n')
    assert len(out) == 7 and out[-1] == ''
    r42 = out[0].split('\t')
    assert len(r42) == 5 and out[1] == out[0] and out[2] != out[0]
    want = Chem.MolToSmiles(Chem.MolFromSmiles(mol))
    for s in r42 + out[2].split('\t'):
        assert Chem.MolToSmiles(Chem.MolFromSmiles(s)) == want
    assert len(set(r42)) > 1                      # random atom orders, not the same string
    assert out[3] == '' and out[4] == ''          # unparsable, malformed: an empty line
    assert float(out[5].split('\t')[0]) > 0       # and it goes on scoring


def test_a_failing_component_gives_nan_not_a_crash(capsys):
    from molgen.scoring.__main__ import answer
    sc = S.Scorer({'component': [{'kind': 'qed'}]})

    def boom(mol):
        raise RuntimeError('no QED today')
    sc.entries[0].comp.raw = boom
    assert answer(sc, 'CCO') == 'nan'
    assert "cannot score 'CCO': RuntimeError: no QED today" in capsys.readouterr().err
    assert math.isnan(S.score_smiles(sc, ['CCO'])[0])


def test_numbers_have_no_exponent():
    assert S.format_number(3.2e-12) == '0.0000000000032'
    assert S.format_number(1.0) == '1.0' and S.format_number(0.25) == '0.25'
    assert float(S.format_number(E(-50 / 4))) == pytest.approx(E(-12.5), rel=1e-6)


def test_shipped_example_config():
    path = os.path.join(os.path.dirname(S.__file__), 'examples', 'druglike.toml')
    sc = S.load(path)
    r = sc.score('CC(=O)Oc1ccccc1C(=O)O')
    c = dict(r.components)
    # weighted geometric mean (qed weight 2, the five others 1) of the component scores
    want = (c['qed'] ** 2 * c['sa'] * c['mw'] * c['hbd'] * c['moses_filters'] * c['alerts']) ** (1 / 7)
    assert r.score == pytest.approx(want, rel=1e-12) and r.score > 0
    assert c['qed'] == QED.qed(Chem.MolFromSmiles('CC(=O)Oc1ccccc1C(=O)O')) and c['hbd_raw'] == 1
    assert sc('O=[N+]([O-])c1ccc(CC(=O)NC2CCN(Cc3ccccc3)CC2)cc1') == 0.0  # the nitro alert
