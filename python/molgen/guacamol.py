"""GuacaMol's distribution-learning scores of a sample file, and the stereo
and charge content of samples against their training data.

GuacaMol (Brown et al., J. Chem. Inf. Model. 2019) scores a generator on
n = 10,000 molecules:
  validity     valid share of the first n samples;
  uniqueness   distinct stereo-free canonical SMILES among the first n valid
               samples, over n;
  novelty      of the first n distinct samples, the share absent from the
               training set (both stereo-free canonical);
  KL score     the mean of exp(-KL) over ten distributions: four continuous
               descriptors (BertzCT, MolLogP, MolWt, TPSA; Gaussian kernel
               densities on 1,000 points over both sets' range), five counts
               (H-bond acceptors, donors, rotatable bonds, aliphatic and
               aromatic rings; 10-bin histograms over the reference's range)
               and each molecule's nearest-neighbour Tanimoto similarity
               within its own set (ECFP4, 4,096 bits); the reference is a
               random n of the training set, the samples the first n distinct.
FCD needs the ChemNet weights, which are not available offline: not computed.

Used by `python3 -m molgen.metrics SAMPLES --train F --guacamol`.
"""

import random

GUACAMOL_N = 10000

# the nine descriptors, in GuacaMol's order: the first four continuous
DESCRIPTORS = ('BertzCT', 'MolLogP', 'MolWt', 'TPSA', 'NumHAcceptors', 'NumHDonors',
               'NumRotatableBonds', 'NumAliphaticRings', 'NumAromaticRings')
N_CONTINUOUS = 4

# GuacaMol's published distribution-learning baselines (Brown et al. 2019,
# table 2; trained on ChEMBL): validity, uniqueness, novelty, KL score
BASELINES = {
    'SMILES LSTM (ChEMBL)': (0.959, 1.000, 0.912, 0.991),
    'AAE': (0.822, 1.000, 0.998, 0.886),
    'ORGAN': (0.379, 0.841, 0.687, 0.267),
    'VAE': (0.870, 0.999, 0.974, 0.982),
}
GPT_BASELINE = ('MolGPT-style GPT (ChEMBL)', (0.976, 0.999, 0.940, None))


def _canon(smi, stereo=False):
    from rdkit import Chem
    if not smi:
        return None
    m = Chem.MolFromSmiles(smi)
    if m is None or m.GetNumAtoms() == 0:
        return None
    return Chem.MolToSmiles(m, isomericSmiles=stereo)


def _first_distinct(canon, n):
    seen, out = set(), []
    for c in canon:
        if c is not None and c not in seen:
            seen.add(c)
            out.append(c)
            if len(out) == n:
                break
    return out


def _descriptors(smiles):
    """[len(smiles), 9] float64; a molecule whose descriptor is not finite
    gets 0 there (as GuacaMol does)."""
    import numpy as np
    from rdkit import Chem
    from rdkit.Chem import Descriptors
    fns = [getattr(Descriptors, d) for d in DESCRIPTORS]
    rows = []
    for s in smiles:
        m = Chem.MolFromSmiles(s)
        if m is None:
            continue
        rows.append([f(m) for f in fns])
    d = np.asarray(rows, dtype=np.float64).reshape(-1, len(DESCRIPTORS))
    d[~np.isfinite(d)] = 0.0
    return d


def _nn_similarity(smiles):
    """Each molecule's largest ECFP4 (r 2, 4,096 bits) Tanimoto similarity
    to another molecule of the same list: [len(smiles)]."""
    import numpy as np
    from rdkit import Chem, DataStructs
    from rdkit.Chem import AllChem
    fps = []
    for s in smiles:
        m = Chem.MolFromSmiles(s)
        if m is not None:
            fps.append(AllChem.GetMorganFingerprintAsBitVect(m, 2, 4096))
    best = np.zeros(len(fps))
    for i in range(1, len(fps)):
        sims = np.asarray(DataStructs.BulkTanimotoSimilarity(fps[i], fps[:i]))
        best[i] = max(best[i], sims.max())
        np.maximum(best[:i], sims, out=best[:i])
    return best


def _kl_continuous(ref, gen):
    import numpy as np
    from scipy.stats import entropy, gaussian_kde
    both = np.concatenate([ref, gen])
    x = np.linspace(both.min(), both.max(), 1000)
    return float(entropy(gaussian_kde(ref)(x) + 1e-10, gaussian_kde(gen)(x) + 1e-10))


def _kl_discrete(ref, gen):
    import numpy as np
    from scipy.stats import entropy
    p, edges = np.histogram(ref, bins=10, density=True)
    q, _ = np.histogram(gen, bins=edges, density=True)
    return float(entropy(p + 1e-10, q + 1e-10))


def kl_score(gen_distinct, ref):
    """(score, {distribution: KL}) of distinct generated molecules against
    reference molecules (stereo-free canonical SMILES both)."""
    import numpy as np
    dg, dr = _descriptors(gen_distinct), _descriptors(ref)
    cols = [(name, dr[:, i], dg[:, i], i < N_CONTINUOUS) for i, name in enumerate(DESCRIPTORS)]
    cols.append(('internal_similarity', _nn_similarity(ref), _nn_similarity(gen_distinct), True))
    kls = {}
    for name, r, g, continuous in cols:
        try:
            kls[name] = (_kl_continuous if continuous else _kl_discrete)(r, g)
        except np.linalg.LinAlgError:
            # a kernel density of identical values (a tiny or one-valued
            # set) is singular: the histogram's KL instead
            kls[name] = _kl_discrete(r, g)
    return float(np.mean([np.exp(-v) for v in kls.values()])), kls


def guacamol_scores(samples, train, n=GUACAMOL_N, seed=42):
    """GuacaMol's validity, uniqueness, novelty and KL score of `samples`
    (SMILES, '' = an invalid sample) against `train` (SMILES). Counts are
    of the first n samples (fewer when the file has fewer: said in 'notes')."""
    notes = []
    first = list(samples[:n])
    if len(first) < n:
        notes.append('%d samples, fewer than GuacaMol\'s %d: shares are of %d'
                     % (len(first), n, len(first)))
    nn = max(len(first), 1)
    canon = [_canon(s) for s in samples]
    validity = sum(c is not None for c in canon[:n]) / nn
    valid = [c for c in canon if c is not None][:n]
    uniqueness = len(set(valid)) / nn
    distinct = _first_distinct(canon, n)
    train_canon = set(c for c in (_canon(s) for s in train) if c is not None)
    novelty = sum(c not in train_canon for c in distinct) / nn
    ref = random.Random(seed).sample(list(train), min(n, len(train)))
    ref = [c for c in (_canon(s) for s in ref) if c is not None]
    score, kls = kl_score(distinct, ref) if distinct and ref else (None, {})
    return {'n': n, 'validity': validity, 'uniqueness': uniqueness, 'novelty': novelty,
            'kl_score': score, 'kl_divergences': kls, 'FCD': None,
            'FCD_note': 'not computed: the ChemNet weights are not available offline',
            'notes': notes}


def _stereo_marks(smi):
    """(atoms written with @/@@, double bonds written with / or \\ on both
    sides) of one SMILES, read without sanitising so nothing is dropped."""
    from rdkit import Chem
    m = Chem.MolFromSmiles(smi, sanitize=False)
    if m is None:
        return 0, 0
    atoms = sum(a.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED for a in m.GetAtoms())
    directional = (Chem.BondDir.ENDUPRIGHT, Chem.BondDir.ENDDOWNRIGHT)
    bonds = 0
    for b in m.GetBonds():
        if b.GetBondType() != Chem.BondType.DOUBLE:
            continue
        ends = []
        for a in (b.GetBeginAtom(), b.GetEndAtom()):
            ends.append(any(nb.GetBondDir() in directional
                            for nb in a.GetBonds() if nb.GetIdx() != b.GetIdx()))
        bonds += all(ends)
    return atoms, bonds


def _stereo_kept(mol):
    from rdkit import Chem
    atoms = sum(a.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED for a in mol.GetAtoms())
    bonds = sum(b.GetStereo() not in (Chem.BondStereo.STEREONONE, Chem.BondStereo.STEREOANY)
                for b in mol.GetBonds() if b.GetBondType() == Chem.BondType.DOUBLE)
    return atoms, bonds


def stereo_charge(samples, data=None):
    """Shares of valid samples (and of `data`) with stereo marks and with
    charged atoms, and the share of the samples' written stereocentres and
    stereo double bonds that RDKit keeps as specified."""
    from rdkit import Chem

    def shares(smiles):
        n = stereo = charged = 0
        wa = wb = ka = kb = 0
        for s in smiles:
            m = Chem.MolFromSmiles(s) if s else None
            if m is None:
                continue
            n += 1
            stereo += ('@' in s) or ('/' in s) or ('\\' in s)
            charged += any(a.GetFormalCharge() != 0 for a in m.GetAtoms())
            a, b = _stereo_marks(s)
            k, l = _stereo_kept(m)
            wa, wb, ka, kb = wa + a, wb + b, ka + min(k, a), kb + min(l, b)
        d = max(n, 1)
        return {'n_valid': n, 'stereo_share': stereo / d, 'charge_share': charged / d,
                'stereocentres_written': wa, 'stereocentres_kept': ka,
                'stereo_bonds_written': wb, 'stereo_bonds_kept': kb}

    out = {'samples': shares(samples)}
    if data is not None:
        out['data'] = shares(data)
    return out
