"""Tests of molgen/metrics.py on tiny hand-made sets whose answers follow from
the definitions. Run with /usr/bin/python3 -m pytest (needs RDKit + numpy)."""
import importlib.util
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
SCRIPT = os.path.join(HERE, '..', 'metrics.py')


def _load():
    spec = importlib.util.spec_from_file_location('molgen_metrics', SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


M = _load()


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
    p = subprocess.run([sys.executable, SCRIPT, s, '--train', t, '--ref', r, '--json',
                        str(out), '--jobs', '1', '-q'], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert 'valid' in p.stdout and 'novelty' in p.stdout and 'W1 QED' in p.stdout
    j = json.loads(out.read_text())
    # blank lines at the end of the file are not samples
    assert j['n_samples'] == 4
    assert j['n_valid'] == 3
    assert j['n_train'] == 2
    assert j['novelty'] == pytest.approx(0.5)  # {CCO, phenol}; CCO in training
    assert j['SNN'] == pytest.approx(1.0)


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
    env = dict(os.environ, PYTHONPATH=str(fake))
    p = subprocess.run([sys.executable, SCRIPT, s], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and 'RDKit is not available' in lines[0]


def test_missing_file_is_a_clear_error(tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, str(tmp_path / 'nope.smi')],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and 'no such file' in p.stderr
