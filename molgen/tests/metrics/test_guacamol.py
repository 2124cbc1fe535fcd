"""molgen.guacamol (GuacaMol's distribution-learning scores, stereo and
charge shares) on hand-made sets whose answers follow from the definitions,
and molgen.split against the validation loss `molgen train` reports."""
import json
import math
import os

import pytest

np = pytest.importorskip('numpy')
pytest.importorskip('rdkit')
pytest.importorskip('scipy')

from molgen import guacamol as G  # noqa: E402
from molgen import split as S  # noqa: E402
from molgen_bin import TINY, run_molgen, write_molecules  # noqa: E402


def test_validity_uniqueness_novelty_by_hand():
    samples = ['CCO', 'OCC', 'C1CC', '', 'c1ccccc1', 'C[C@H](N)C(=O)O', 'CC(N)C(=O)O']
    train = ['c1ccccc1', 'CCCC']
    g = G.guacamol_scores(samples, train, n=7)
    assert g['validity'] == pytest.approx(5 / 7)        # C1CC and '' are invalid
    # stereo-free canonical forms: ethanol twice, alanine twice, benzene
    assert g['uniqueness'] == pytest.approx(3 / 7)
    # of the 3 distinct, benzene is in the training set
    assert g['novelty'] == pytest.approx(2 / 7)


def test_kl_score_of_a_set_against_itself_is_one():
    mols = ['CCO', 'CCN', 'c1ccccc1O', 'CC(=O)Nc1ccccc1', 'CCCCCCC', 'C1CCNCC1', 'OC(=O)CCl',
            'c1ccncc1', 'CC(C)Cc1ccc(C(C)C(=O)O)cc1', 'COc1ccc2[nH]ccc2c1']
    score, kls = G.kl_score(mols, mols)
    assert set(kls) == set(G.DESCRIPTORS) | {'internal_similarity'}
    assert score == pytest.approx(1.0, abs=1e-9)


def test_discrete_kl_by_hand():
    ref = np.array([0, 0, 1, 1, 1, 2, 3, 3, 3, 3], dtype=float)
    gen = np.array([0, 1, 1, 2, 2, 2, 3], dtype=float)
    # 10 bins over [0, 3], width 0.3: the values fall in bins 0, 3, 6 and 9
    p = np.zeros(10)
    q = np.zeros(10)
    for v in ref:
        p[min(int(v / 0.3), 9)] += 1
    for v in gen:
        q[min(int(v / 0.3), 9)] += 1
    p, q = p / (len(ref) * 0.3) + 1e-10, q / (len(gen) * 0.3) + 1e-10
    p, q = p / p.sum(), q / q.sum()
    want = float(np.sum(p * np.log(p / q)))
    assert G._kl_discrete(ref, gen) == pytest.approx(want, rel=1e-12)
    assert want > 0.05


def test_stereo_and_charge_shares():
    samples = ['C[C@H](N)C(=O)O',   # a real stereocentre: kept
               'C[C@H](C)C',        # not a stereocentre: RDKit drops it
               'F/C=C/F',           # a stereo double bond: kept
               'C[NH3+]',           # charged
               'CCO', 'C1CC']       # plain; invalid (not counted)
    sc = G.stereo_charge(samples)['samples']
    assert sc['n_valid'] == 5
    assert sc['stereo_share'] == pytest.approx(3 / 5)
    assert sc['charge_share'] == pytest.approx(1 / 5)
    assert (sc['stereocentres_written'], sc['stereocentres_kept']) == (2, 1)
    assert (sc['stereo_bonds_written'], sc['stereo_bonds_kept']) == (1, 1)


def test_split_indices_partition():
    tr, va = S.split_indices(1000, 0.05, 1)
    assert len(va) == 50 and len(tr) == 950
    assert sorted(tr + va) == list(range(1000))
    assert S.split_indices(1000, 0.05, 2)[1] != va


def _val_loss(tmp_path, model, mols):
    p = tmp_path / 'v.smi'
    p.write_text(''.join(m + '\n' for m in mols))
    out = run_molgen(['score', '--model', model, '--smiles', str(p), '--quiet', '--threads', '1'])
    import csv
    import io
    nll = tok = 0.0
    for row in csv.DictReader(io.StringIO(out.stdout)):
        assert row['status'] == 'ok', row
        nll += float(row['nll'])
        tok += float(row['tokens'])
    return nll / tok


def test_split_is_the_validation_molgen_train_used(tmp_path):
    data, mols = write_molecules(tmp_path, 200)
    model = str(tmp_path / 'm.safetensors')
    out = run_molgen(['train', '--data', data, '--steps', '6', '--val-frac', '0.25', '--seed', '5',
                      '--val-max', '0', '--dtype', 'fp32', '--out', model] + TINY)
    reported = json.loads(out.stdout.strip().splitlines()[-1])['val_loss']
    _, va = S.split_indices(len(mols), 0.25, 5)
    assert len(va) == 50
    assert _val_loss(tmp_path, model, [mols[i] for i in va]) == pytest.approx(reported, rel=1e-5)
    # another seed's split is another loss: the comparison can fail
    _, other = S.split_indices(len(mols), 0.25, 6)
    assert not math.isclose(_val_loss(tmp_path, model, [mols[i] for i in other]), reported,
                            rel_tol=1e-5)


def test_metrics_guacamol_needs_train(tmp_path):
    import subprocess
    import sys
    p = tmp_path / 's.smi'
    p.write_text('CCO\n')
    env = dict(os.environ, PYTHONPATH=os.path.join(S.__file__, '..', '..'))
    r = subprocess.run([sys.executable, '-m', 'molgen.metrics', str(p), '--guacamol'],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 2 and '--guacamol needs --train' in r.stderr


def test_nearest_neighbour_similarity_against_rdkit():
    from rdkit import Chem, DataStructs
    from rdkit.Chem import AllChem
    mols = ['CCO', 'CCN', 'CCCO', 'c1ccccc1O', 'c1ccccc1N', 'CC(=O)Nc1ccc(O)cc1', 'C1CCNCC1',
            'CC(C)Cc1ccc(C(C)C(=O)O)cc1']
    fps = [AllChem.GetMorganFingerprintAsBitVect(Chem.MolFromSmiles(s), 2, 4096) for s in mols]
    want = [max(DataStructs.TanimotoSimilarity(fps[i], fps[j]) for j in range(len(mols)) if j != i)
            for i in range(len(mols))]
    got = G._nn_similarity(mols, block=3)   # blocks that split the list
    assert got == pytest.approx(want, abs=1e-6)
