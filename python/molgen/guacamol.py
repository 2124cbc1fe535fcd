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


def _canon_many(chunk):
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')
    return [_canon(s) for s in chunk]


def _chunked(map_chunks, fn, items, chunk=1000):
    """fn over chunks of items through map_chunks(fn, list of chunks) (a
    process pool's map, or the builtin one), flattened."""
    chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
    return [x for part in map_chunks(fn, chunks) for x in part]


def _first_distinct(canon, n):
    seen, out = set(), []
    for c in canon:
        if c is not None and c not in seen:
            seen.add(c)
            out.append(c)
            if len(out) == n:
                break
    return out


def _descriptors_many(chunk):
    """[len(chunk) parsed, 9] rows of the descriptors; a molecule whose
    descriptor is not finite gets 0 there (as GuacaMol does)."""
    import math
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Descriptors
    RDLogger.DisableLog('rdApp.*')
    fns = [getattr(Descriptors, d) for d in DESCRIPTORS]
    rows = []
    for s in chunk:
        m = Chem.MolFromSmiles(s)
        if m is not None:
            rows.append([v if math.isfinite(v) else 0.0 for v in (float(f(m)) for f in fns)])
    return rows


def _fingerprints_many(chunk):
    """ECFP4 (radius 2, 4,096 bits) of each parsed SMILES as 0/1 uint8 rows."""
    import numpy as np
    from rdkit import Chem, RDLogger
    from rdkit.Chem import AllChem
    RDLogger.DisableLog('rdApp.*')
    out = []
    for s in chunk:
        m = Chem.MolFromSmiles(s)
        if m is not None:
            fp = AllChem.GetMorganFingerprintAsBitVect(m, 2, 4096)
            out.append(np.frombuffer(fp.ToBitString().encode('ascii'), dtype=np.uint8) - 48)
    return out


def _nn_similarity(smiles, map_chunks=None, block=1024):
    """Each molecule's largest ECFP4 Tanimoto similarity to another molecule
    of the same list: [n]. The intersections are a product of the 0/1
    fingerprint matrices (exact in float32: counts <= 4,096), by row blocks."""
    import numpy as np
    map_chunks = map_chunks or (lambda fn, chunks: list(map(fn, chunks)))
    rows = _chunked(map_chunks, _fingerprints_many, list(smiles), 500)
    if not rows:
        return np.zeros(0)
    f = np.stack(rows).astype(np.float32)
    cnt = f.sum(1)
    best = np.empty(len(f))
    for s in range(0, len(f), block):
        inter = f[s:s + block] @ f.T
        union = cnt[s:s + block, None] + cnt[None, :] - inter
        t = np.where(union > 0, inter / np.maximum(union, 1.0), 0.0)
        idx = np.arange(s, min(s + block, len(f)))
        t[idx - s, idx] = -1.0   # not itself
        best[s:s + block] = t.max(1) if len(f) > 1 else 0.0
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


def kl_score(gen_distinct, ref, map_chunks=None):
    """(score, {distribution: KL}) of distinct generated molecules against
    reference molecules (stereo-free canonical SMILES both)."""
    import numpy as np
    map_chunks = map_chunks or (lambda fn, chunks: list(map(fn, chunks)))

    def desc(smiles):
        d = _chunked(map_chunks, _descriptors_many, list(smiles), 250)
        return np.asarray(d, dtype=np.float64).reshape(-1, len(DESCRIPTORS))
    dg, dr = desc(gen_distinct), desc(ref)
    cols = [(name, dr[:, i], dg[:, i], i < N_CONTINUOUS) for i, name in enumerate(DESCRIPTORS)]
    cols.append(('internal_similarity', _nn_similarity(ref, map_chunks),
                 _nn_similarity(gen_distinct, map_chunks), True))
    kls = {}
    for name, r, g, continuous in cols:
        try:
            kls[name] = (_kl_continuous if continuous else _kl_discrete)(r, g)
        except np.linalg.LinAlgError:
            # a kernel density of identical values (a tiny or one-valued
            # set) is singular: the histogram's KL instead
            kls[name] = _kl_discrete(r, g)
    return float(np.mean([np.exp(-v) for v in kls.values()])), kls


def guacamol_scores(samples, train, n=GUACAMOL_N, seed=42, map_chunks=None):
    """GuacaMol's validity, uniqueness, novelty and KL score of `samples`
    (SMILES, '' = an invalid sample) against `train` (SMILES). Counts are
    of the first n samples (fewer when the file has fewer: said in 'notes').
    map_chunks(fn, chunks): a process pool's map for the parsing (default:
    in this process)."""
    def mp(chunks_fn, chunks):
        return list(map(chunks_fn, chunks))
    map_chunks = map_chunks or mp
    notes = []
    first = list(samples[:n])
    if len(first) < n:
        notes.append('%d samples, fewer than GuacaMol\'s %d: shares are of %d'
                     % (len(first), n, len(first)))
    nn = max(len(first), 1)
    canon = _chunked(map_chunks, _canon_many, list(samples))
    validity = sum(c is not None for c in canon[:n]) / nn
    valid = [c for c in canon if c is not None][:n]
    uniqueness = len(set(valid)) / nn
    distinct = _first_distinct(canon, n)
    train_canon = set(c for c in _chunked(map_chunks, _canon_many, list(train)) if c is not None)
    novelty = sum(c not in train_canon for c in distinct) / nn
    ref = random.Random(seed).sample(list(train), min(n, len(train)))
    ref = [c for c in _chunked(map_chunks, _canon_many, ref) if c is not None]
    score, kls = kl_score(distinct, ref, map_chunks) if distinct and ref else (None, {})
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


def _shares_many(chunk):
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')
    return [_stereo_charge_one(s) for s in chunk]


def _stereo_charge_one(s):
    """(valid, stereo written, charged, centres written, kept, double bonds
    written, kept) of one SMILES."""
    from rdkit import Chem
    m = Chem.MolFromSmiles(s) if s else None
    if m is None:
        return (0, 0, 0, 0, 0, 0, 0)
    a, b = _stereo_marks(s)
    k, l = _stereo_kept(m)
    return (1, int(('@' in s) or ('/' in s) or ('\\' in s)),
            int(any(x.GetFormalCharge() != 0 for x in m.GetAtoms())), a, min(k, a), b, min(l, b))


def stereo_charge(samples, data=None, map_chunks=None):
    """Shares of valid samples (and of `data`) with stereo marks and with
    charged atoms, and the share of the samples' written stereocentres and
    stereo double bonds that RDKit keeps as specified."""
    map_chunks = map_chunks or (lambda fn, chunks: list(map(fn, chunks)))

    def shares(smiles):
        t = [sum(col) for col in zip(*_chunked(map_chunks, _shares_many, list(smiles)))] or [0] * 7
        d = max(t[0], 1)
        return {'n_valid': t[0], 'stereo_share': t[1] / d, 'charge_share': t[2] / d,
                'stereocentres_written': t[3], 'stereocentres_kept': t[4],
                'stereo_bonds_written': t[5], 'stereo_bonds_kept': t[6]}

    out = {'samples': shares(samples)}
    if data is not None:
        out['data'] = shares(data)
    return out
