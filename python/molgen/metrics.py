"""MOSES-style metrics of generated SMILES against a training and a reference set.

Usage:
    /usr/bin/python3 -m molgen.metrics SAMPLES.smi --train TRAIN.smi --ref REF.smi \
        [--json out.json] [--max-ref N] [--max-gen N] [--seed S] [--jobs J] \
        [--condition logp=2.5,qed=0.8,...] [--scaffold SMILES]

Needs RDKit and numpy (Debian's /usr/bin/python3 has both; a python3 without
RDKit gets a one-line message and exit status 2). scipy is used for the
Wasserstein distance when present, otherwise an exact numpy implementation.

Definitions follow MOSES (Polykovskiy et al. 2020, github molecularsets/moses,
moses/metrics/metrics.py) unless noted:
  validity     fraction of sample lines that RDKit parses to a non-empty
               molecule (an empty line counts as an invalid sample; blank
               lines at the very end of the file are ignored).
  unique@k     fraction of distinct canonical SMILES among the first k valid
               samples (k = 1000, 10000); if fewer than k are valid, computed
               over all valid ones and flagged in the notes.
  novelty      fraction of the distinct valid canonical samples that are not
               in the canonicalised training set (used whole).
  IntDiv_p     1 - mean_i (mean_j T(i,j)^p)^(1/p) over the valid samples
               (all pairs, self-pairs included, as MOSES), T = Tanimoto of
               Morgan radius 2, 1024-bit fingerprints. For p = 1 this is
               1 - the mean pairwise similarity.
  SNN          mean over samples of the max Tanimoto to the reference set.
  Frag         cosine similarity of BRICS fragment counts
               (FragmentOnBRICSBonds, as MOSES) of samples vs reference.
  Scaf         cosine similarity of Bemis-Murcko scaffold counts (scaffolds
               with >= 2 rings, as MOSES) of samples vs reference.
  W1(prop)     1-D Wasserstein distance between the samples' and the
               reference's distributions of logP (Crippen), SA score (RDKit
               Contrib sascorer), QED and molecular weight.
  Filters      fraction of the valid samples (their canonical SMILES, parsed
               again, as MOSES) that pass MOSES's mol_passes_filters: no ring
               of 8+ atoms, no formal charge, only C N S O F Cl Br H, no match
               of the MCF or PAINS SMARTS (molgen/moses_filters/) on the
               molecule with explicit hydrogens added, and a non-isomeric
               canonical SMILES that is non-empty and parses again. Over all
               valid samples (no subsampling); also reported for the
               reference molecules that SNN, Frag, Scaf and W1 use (the table's
               "reference"). The failures are counted by clause.
Subsampling, for speed (seeded by --seed; reported in the notes): IntDiv,
SNN, Frag, Scaf and W1 use at most --max-gen random valid samples and at most
--max-ref random reference molecules (default 10,000 each; MOSES uses the
whole sets, so Scaf in particular is not directly comparable to published
numbers unless both limits cover the whole sets).
Sampling: the settings that made the samples (molgen sample's SAMPLES.json
sidecar: --constrain mode, temperature, top-k/p, seed, model) are printed
first and kept in the JSON as "sampling" (null when there is no sidecar).
Conditional generation (molgen sample --condition / a requested scaffold):
  --condition NAME=VALUE,...  for each requested property (molgen.props's logp,
               qed, sas, tpsa, mw, computed as molgen.props does) over the valid
               samples: MAD = mean |p - target| and SD = the standard
               deviation of p - target (MolGPT's definitions).
  --scaffold S the share of valid samples whose Bemis-Murcko scaffold
               (molgen.props's murcko_scaffold, canonical SMILES) is exactly S's,
               and the mean Tanimoto similarity (Morgan r=2, 1024 bits) of
               the samples' scaffolds to S's (an acyclic sample's empty
               scaffold counts as 0).
Not computed: FCD (Frechet ChemNet Distance): it needs the trained ChemNet
weights, which are not available offline; the output says so.
"""

import argparse
import json
import math
import os
import random
import sys
import time

from molgen import moses_filters
from molgen.moses_filters import FilterDataError, filters_summary

MAX_REF_DEFAULT = 10000
MAX_GEN_DEFAULT = 10000
NOT_COMPUTED = {'FCD': 'needs the weights of the trained ChemNet network, which MOSES '
                       'downloads with the fcd_torch package; not available offline'}

# ------------------------------------------------------------------ imports


def _require_deps():
    """Import numpy and RDKit or exit with a one-line message."""
    try:
        import numpy  # noqa: F401
    except Exception as e:  # pragma: no cover - environment dependent
        sys.stderr.write("molgen.metrics: numpy is not available in %s (%s); "
                         "run with /usr/bin/python3\n" % (sys.executable, e))
        sys.exit(2)
    try:
        from rdkit import Chem  # noqa: F401
    except Exception as e:
        sys.stderr.write("molgen.metrics: RDKit is not available in %s (%s); "
                         "run with /usr/bin/python3 (Debian python3-rdkit)\n"
                         % (sys.executable, e))
        sys.exit(2)


def _props():
    """molgen.props: the property functions (imported late: it needs RDKit)."""
    from molgen import props
    return props


def _sascorer():
    """RDKit Contrib's sascorer module, or False if unavailable."""
    try:
        return _props().sascorer()
    except Exception:
        return False


def _quiet_rdkit():
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')


# ------------------------------------------------------------------ I/O


def read_smiles(path, samples=False):
    """First whitespace-separated field of each line. A reference or
    training file skips blank and '#' lines; a samples file (samples=True)
    keeps every line as one sample: a blank line before the last sample
    is an empty (invalid) sample and a line starting with '#' is a generated string, not a
    comment."""
    out = []
    with open(path, encoding='utf-8', errors='replace') as f:
        for line in f:
            s = line.strip()
            if not samples and (not s or s.startswith('#')):
                continue
            out.append(s.split()[0] if s else '')
    while samples and out and not out[-1]:  # trailing blank lines: no samples
        out.pop()
    return out


# ------------------------------------------------------------------ workers


def _canon(smi):
    """Canonical SMILES or None (invalid / empty)."""
    from rdkit import Chem
    if not smi:
        return None
    m = Chem.MolFromSmiles(smi)
    if m is None or m.GetNumAtoms() == 0:
        return None
    return Chem.MolToSmiles(m)


def _canon_many(chunk):
    _quiet_rdkit()
    return [_canon(s) for s in chunk]


def _fp_bits(mol):
    import numpy as np
    from rdkit.Chem import AllChem
    fp = AllChem.GetMorganFingerprintAsBitVect(mol, 2, nBits=1024)
    return np.frombuffer(fp.ToBitString().encode('ascii'), dtype=np.uint8) - 48


def _scaffold(mol):
    """MOSES's scaffold: the Bemis-Murcko scaffold with >= 2 rings, else None."""
    s = _props().murcko_scaffold(mol, min_rings=2)
    return s or None


def _features(smi):
    """(fingerprint bits, BRICS fragments, scaffold, (logP, SA, QED, MW)) of
    one SMILES, parsed once; None if it does not parse."""
    from rdkit import Chem
    from rdkit.Chem import AllChem, Crippen, Descriptors, QED
    m = Chem.MolFromSmiles(smi)
    if m is None or m.GetNumAtoms() == 0:
        return None
    frags = Chem.MolToSmiles(AllChem.FragmentOnBRICSBonds(m)).split('.')
    sa = _sascorer()
    props = (float(Crippen.MolLogP(m)), float(sa.calculateScore(m)) if sa else float('nan'),
             float(QED.qed(m)), float(Descriptors.MolWt(m)))
    return _fp_bits(m), frags, _scaffold(m), props


def parse_condition(text):
    """'logp=2.5,qed=0.8' -> {'logp': 2.5, 'qed': 0.8} (molgen.props's names)."""
    props = _props()
    out = {}
    for part in text.split(','):
        name, eq, val = part.partition('=')
        name = name.strip()
        if not eq or name not in props.PROPERTIES:
            raise ValueError("--condition: '%s' is not NAME=VALUE with NAME one of %s"
                             % (part, ', '.join(props.PROPERTIES)))
        if name in out:
            raise ValueError('--condition: %s given twice' % name)
        try:
            v = float(val)
        except ValueError:
            v = float('nan')
        if not math.isfinite(v):
            raise ValueError("--condition: %s: '%s' is not a finite number" % (name, val))
        out[name] = v
    return out


def _cond_many(chunk):
    """(properties, scaffold SMILES) of each valid canonical SMILES; None for
    one RDKit cannot parse again (a round-trip failure, rare)."""
    _quiet_rdkit()
    from rdkit import Chem
    props = _props()
    res = []
    for smi in chunk:
        m = Chem.MolFromSmiles(smi)
        res.append(None if m is None else (props.properties(m), props.murcko_scaffold(m)))
    return res


def _scaffold_fp(smi):
    from rdkit import Chem
    m = Chem.MolFromSmiles(smi) if smi else None
    if m is None or m.GetNumAtoms() == 0:
        return None
    from rdkit.Chem import AllChem
    return AllChem.GetMorganFingerprintAsBitVect(m, 2, nBits=1024)


def condition_metrics(valid, targets=None, scaffold=None, jobs=1):
    """MAD / SD of each target property and scaffold matches over the valid
    (canonical) samples; see the module's docstring."""
    import numpy as np
    from rdkit import Chem, DataStructs
    props = _props()
    mapper = _Mapper(jobs)
    try:
        feats = _flat(mapper.map(_cond_many, list(valid)))
    finally:
        mapper.close()
    # the valid samples whose canonical SMILES does not parse again are left out, and counted
    out = {'n_valid': len(valid), 'n_round_trip_failed': sum(f is None for f in feats)}
    feats = [f for f in feats if f is not None]
    out['n_used'] = len(feats)  # what MAD, SD and the scaffold share are over
    if targets:
        out['properties'] = {}
        for name, t in targets.items():
            dev = np.array([f[0][name] - t for f in feats], dtype=np.float64)
            out['properties'][name] = {
                'target': t, 'MAD': float(np.mean(np.abs(dev))) if len(dev) else None,
                'SD': float(np.std(dev)) if len(dev) else None,
                'mean': float(np.mean(dev) + t) if len(dev) else None}
    if scaffold is not None:
        m = Chem.MolFromSmiles(scaffold)
        if m is None:
            raise ValueError('--scaffold: RDKit cannot parse %s' % scaffold)
        want = props.murcko_scaffold(m)
        want_fp = _scaffold_fp(want)
        exact = sum(1 for f in feats if f[1] == want)
        sims = []
        for f in feats:
            fp = _scaffold_fp(f[1])
            sims.append(DataStructs.TanimotoSimilarity(want_fp, fp) if fp is not None and
                        want_fp is not None else 0.0)
        out['scaffold'] = {'requested': scaffold, 'murcko': want,
                           'exact_share': exact / len(feats) if feats else None,
                           'mean_tanimoto': float(np.mean(sims)) if sims else None}
    return out


def format_condition(c):
    lines = []
    for name, r in (c.get('properties') or {}).items():
        lines.append('%-10s  target %g: MAD %s, SD %s (mean %s; %d valid)' % (
            name, r['target'], _fmt(r['MAD']), _fmt(r['SD']), _fmt(r['mean']), c['n_used']))
    s = c.get('scaffold')
    if s:
        lines.append('scaffold    %s: exact %s, mean Tanimoto %s (%d valid)' % (
            s['murcko'], _fmt(s['exact_share']), _fmt(s['mean_tanimoto']), c['n_used']))
    if c.get('n_round_trip_failed'):
        lines.append('(%d valid samples left out: their canonical SMILES does not parse again)'
                     % c['n_round_trip_failed'])
    return '\n'.join(lines)


def _without_ref_metrics(res):
    """res with the metrics against the reference set marked not computed."""
    for k in ('SNN', 'Frag', 'Scaf'):
        res[k] = None
    res['wasserstein'] = None
    return res


def _without_sample_features(res):
    """res with the metrics that need sample features marked not computed."""
    res['IntDiv1'] = res['IntDiv2'] = None
    return _without_ref_metrics(res)


def _features_many(chunk):
    _quiet_rdkit()
    return [_features(s) for s in chunk]


class _Mapper:
    """Chunked map over a process pool (or in-process for jobs == 1)."""

    def __init__(self, jobs):
        self.jobs = max(1, int(jobs))
        self.pool = None
        if self.jobs > 1:
            import multiprocessing as mp
            self.pool = mp.get_context('fork').Pool(self.jobs)

    def map(self, fn, items, chunk=500):
        chunks = [items[i:i + chunk] for i in range(0, len(items), chunk)]
        if self.pool is None:
            res = [fn(c) for c in chunks]
        else:
            res = self.pool.map(fn, chunks)
        return res

    def close(self):
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None


def _flat(list_of_lists):
    return [x for sub in list_of_lists for x in sub]


def _features_parsed(mapper, smiles):
    """_features of each SMILES in smiles that RDKit parses (the rest left out)."""
    return [f for f in _flat(mapper.map(_features_many, smiles, 250)) if f is not None]


def _at_most(items, most, rng):
    """items, or a random most of them (rng.sample) when there are more."""
    return rng.sample(items, most) if len(items) > most else items


def _filter_failures_many(chunk):
    """Filters verdict (None = passes, else (clause, detail)) of each valid
    sample's canonical SMILES; one that does not parse again fails, as in
    MOSES."""
    from rdkit import Chem
    _quiet_rdkit()
    f = moses_filters.default()
    return [f.failure(Chem.MolFromSmiles(s) if s else None) for s in chunk]


def _filter_failures_ref_many(chunk):
    """Filters verdicts of the reference SMILES that parse (the others are
    not molecules and are left out)."""
    from rdkit import Chem
    _quiet_rdkit()
    f = moses_filters.default()
    mols = [Chem.MolFromSmiles(s) if s else None for s in chunk]
    return [f.failure(m) for m in mols if m is not None and m.GetNumAtoms() > 0]


# ------------------------------------------------------------------ metrics


def fraction_valid(canon):
    """canon: list of canonical SMILES or None per sample."""
    if not canon:
        return float('nan')
    return sum(c is not None for c in canon) / len(canon)


def unique_at_k(valid_canon, k):
    """(fraction unique among the first k valid, number used, complete?)"""
    sub = valid_canon[:k]
    if not sub:
        return float('nan'), 0, False
    return len(set(sub)) / len(sub), len(sub), len(sub) >= k


def novelty(valid_canon, train_canon_set):
    uniq = set(valid_canon)
    if not uniq:
        return float('nan')
    return len(uniq - train_canon_set) / len(uniq)


def tanimoto_max_mean(a, b, p=1, agg='mean', block=2048):
    """For each row of a (0/1 uint8 [n,1024]): agg over rows of b of T^p.
    agg='mean' returns (mean_j T^p)^(1/p) per row; agg='max' max_j T."""
    import numpy as np
    af = a.astype(np.float32)
    bf = b.astype(np.float32)
    na = af.sum(1)
    nb = bf.sum(1)
    out = np.empty(len(a), dtype=np.float64)
    for s in range(0, len(a), block):
        inter = af[s:s + block] @ bf.T
        union = na[s:s + block, None] + nb[None, :] - inter
        with np.errstate(invalid='ignore', divide='ignore'):
            t = np.where(union > 0, inter / np.maximum(union, 1e-30), 1.0)
        if agg == 'max':
            out[s:s + block] = t.max(1)
        else:
            out[s:s + block] = (np.power(t, p, dtype=np.float64).mean(1)) ** (1.0 / p)
    return out


def internal_diversity(fps, p=1):
    if len(fps) == 0:
        return float('nan')
    return float(1.0 - tanimoto_max_mean(fps, fps, p=p, agg='mean').mean())


def snn(gen_fps, ref_fps):
    if len(gen_fps) == 0 or len(ref_fps) == 0:
        return float('nan')
    return float(tanimoto_max_mean(gen_fps, ref_fps, agg='max').mean())


def cos_similarity(ref_counts, gen_counts):
    """Cosine similarity of two Counters over the union of their keys
    (nan if either is empty), as MOSES."""
    import numpy as np
    if not ref_counts or not gen_counts:
        return float('nan')
    keys = sorted(set(ref_counts) | set(gen_counts))
    r = np.array([ref_counts.get(k, 0) for k in keys], dtype=np.float64)
    g = np.array([gen_counts.get(k, 0) for k in keys], dtype=np.float64)
    return float(r @ g / (np.linalg.norm(r) * np.linalg.norm(g)))


def wasserstein_1d(u, v):
    """W1 between two empirical 1-D distributions (equal weights); the same
    value as scipy.stats.wasserstein_distance."""
    import numpy as np
    u = np.asarray(u, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    u = u[~np.isnan(u)]
    v = v[~np.isnan(v)]
    if len(u) == 0 or len(v) == 0:
        return float('nan')
    try:
        from scipy.stats import wasserstein_distance  # type: ignore
        return float(wasserstein_distance(u, v))
    except Exception:
        pass
    us = np.sort(u)
    vs = np.sort(v)
    allv = np.sort(np.concatenate([us, vs]))
    deltas = np.diff(allv)
    ucdf = np.searchsorted(us, allv[:-1], side='right') / len(us)
    vcdf = np.searchsorted(vs, allv[:-1], side='right') / len(vs)
    return float(np.sum(np.abs(ucdf - vcdf) * deltas))


# ------------------------------------------------------------------ driver


def compute_metrics(samples, train=None, ref=None, max_ref=MAX_REF_DEFAULT,
                    max_gen=MAX_GEN_DEFAULT, seed=0, jobs=1, log=None, ref_filters=True):
    """samples: list of SMILES strings ('' = an empty, invalid sample);
    train, ref: lists of SMILES or None; ref_filters: also compute Filters
    of the (subsampled) reference. Returns a dict (JSON-ready)."""
    import numpy as np
    from collections import Counter
    _quiet_rdkit()
    t_start = time.time()
    rng = random.Random(seed)
    res = {'n_samples': len(samples), 'notes': [],
           'params': {'max_ref': max_ref, 'max_gen': max_gen, 'seed': seed,
                      'fingerprint': 'Morgan r=2, 1024 bits'},
           'Filters': None, 'Filters_ref': None, 'FCD': None,
           'not_computed': dict(NOT_COMPUTED)}
    notes = res['notes']
    timing = {}

    def say(msg):
        if log:
            log(msg)

    # loaded before the pool forks, so that the workers inherit it
    filters_error = None
    try:
        moses_filters.default()
    except FilterDataError as e:
        filters_error = str(e)
        res['not_computed']['Filters'] = filters_error
        notes.append('Filters not computed: ' + filters_error)
    mapper = _Mapper(jobs)
    try:
        t0 = time.time()
        canon = _flat(mapper.map(_canon_many, list(samples)))
        timing['samples_parse_s'] = time.time() - t0
        valid = [c for c in canon if c is not None]
        res['n_valid'] = len(valid)
        res['validity'] = fraction_valid(canon)
        for k, name in ((1000, 'unique@1k'), (10000, 'unique@10k')):
            u, n, complete = unique_at_k(valid, k)
            res[name] = u
            if not complete:
                notes.append('%s computed on only %d valid samples (fewer than %d)'
                             % (name, n, k))
        res['n_unique'] = len(set(valid))
        say('samples: %d, valid %d, unique %d' % (len(samples), len(valid), res['n_unique']))

        if train is not None:
            t0 = time.time()
            train_canon = set(c for c in _flat(mapper.map(_canon_many, list(train), 2000))
                              if c is not None)
            timing['train_canon_s'] = time.time() - t0
            res['n_train'] = len(train)
            res['novelty'] = novelty(valid, train_canon)
            say('train: %d molecules canonicalised in %.1f s' % (len(train), timing['train_canon_s']))
        else:
            res['novelty'] = None
            notes.append('no training set: novelty not computed')

        if valid and filters_error is None:
            t0 = time.time()
            fails = _flat(mapper.map(_filter_failures_many, valid, 100))
            timing['filters_s'] = time.time() - t0
            res['Filters'], res['filters_failures'] = filters_summary(fails)

        if not valid:
            notes.append('no valid samples: the remaining metrics are not computed')
            return _without_sample_features(res)

        # features (fingerprint, fragments, scaffold, properties) of at most
        # max_gen valid samples, each parsed once
        gen_sub = _at_most(valid, max_gen, rng)
        if len(valid) > max_gen:
            notes.append('IntDiv, SNN, Frag, Scaf and W1 on a random %d of %d valid samples'
                         % (max_gen, len(valid)))
        t0 = time.time()
        feat_gen = _features_parsed(mapper, gen_sub)
        timing['samples_features_s'] = time.time() - t0
        # RDKit occasionally writes a canonical SMILES it cannot read back;
        # features from the SMILES as sampled are no way out (for the one
        # seen, c2c=n(C)n2C, RDKit's feature code raises a valence error)
        if len(feat_gen) < len(gen_sub):
            notes.append('%d valid samples have a canonical SMILES that RDKit does not '
                         're-parse; left out of IntDiv, SNN, Frag, Scaf and W1'
                         % (len(gen_sub) - len(feat_gen)))
        res['n_gen_used'] = len(feat_gen)
        if not feat_gen:
            return _without_sample_features(res)
        gen_fps = np.stack([f[0] for f in feat_gen])
        t0 = time.time()
        res['IntDiv1'] = internal_diversity(gen_fps, 1)
        res['IntDiv2'] = internal_diversity(gen_fps, 2)
        timing['intdiv_s'] = time.time() - t0

        if ref is None:
            notes.append('no reference set: SNN, Frag, Scaf and W1 not computed')
            return _without_ref_metrics(res)

        ref_sub = _at_most(list(ref), max_ref, rng)
        if len(ref) > max_ref:
            notes.append('reference subsampled to %d of %d molecules (SNN, Frag, Scaf, W1)'
                         % (max_ref, len(ref)))
        t0 = time.time()
        feat_ref = _features_parsed(mapper, ref_sub)
        timing['ref_features_s'] = time.time() - t0
        if len(feat_ref) < len(ref_sub):
            notes.append('%d reference SMILES do not parse and were ignored'
                         % (len(ref_sub) - len(feat_ref)))
        res['n_ref_used'] = len(feat_ref)
        if filters_error is None and ref_filters:
            t0 = time.time()
            fails = _flat(mapper.map(_filter_failures_ref_many, ref_sub, 250))
            timing['ref_filters_s'] = time.time() - t0
            res['Filters_ref'], res['filters_failures_ref'] = filters_summary(fails)
            res['n_ref_filters'] = len(fails)
        if not feat_ref:
            notes.append('no valid reference molecules: SNN, Frag, Scaf and W1 not computed')
            return _without_ref_metrics(res)
        t0 = time.time()
        ref_fps = np.stack([f[0] for f in feat_ref])
        res['SNN'] = snn(gen_fps, ref_fps)
        timing['snn_s'] = time.time() - t0

        fg, fr, sg, sr = Counter(), Counter(), Counter(), Counter()
        for feats, fc, sc in ((feat_gen, fg, sg), (feat_ref, fr, sr)):
            for f in feats:
                fc.update(f[1])
                if f[2]:
                    sc[f[2]] += 1
        res['Frag'] = cos_similarity(fr, fg)
        res['Scaf'] = cos_similarity(sr, sg)

        pg = np.array([f[3] for f in feat_gen], dtype=np.float64)
        pr = np.array([f[3] for f in feat_ref], dtype=np.float64)
        names = ('logP', 'SA', 'QED', 'weight')
        w = {}
        for i, name in enumerate(names):
            if name == 'SA' and not _sascorer():
                w[name] = None
                notes.append('SA score unavailable (RDKit Contrib SA_Score not found)')
                continue
            w[name] = wasserstein_1d(pg[:, i], pr[:, i])
        res['wasserstein'] = w
        res['property_means'] = {
            'samples': {n: float(np.nanmean(pg[:, i])) for i, n in enumerate(names)},
            'reference': {n: float(np.nanmean(pr[:, i])) for i, n in enumerate(names)},
        }
        return res
    finally:
        mapper.close()
        timing['total_s'] = time.time() - t_start
        res['timing'] = {k: round(v, 2) for k, v in timing.items()}


def _fmt(v, nd=4):
    if v is None:
        return 'n/a'
    if isinstance(v, float) and math.isnan(v):
        return 'nan'
    if isinstance(v, float):
        return ('%.' + str(nd) + 'f') % v
    return str(v)


def _fmt_filters(res):
    """'0.9936  (938 / 944 valid pass; fail: MCF 4, ...; reference 1.0000)'."""
    v = res.get('Filters')
    if v is None:
        return 'n/a'
    fails = res.get('filters_failures') or {}
    n = res.get('n_valid', 0)
    out = '%s  (%d / %d valid pass' % (_fmt(v), n - sum(fails.values()), n)
    if fails:
        out += '; fail: ' + ', '.join('%s %d' % kv for kv in sorted(fails.items()))
    if res.get('Filters_ref') is not None:
        out += '; reference %s of %d' % (_fmt(res['Filters_ref']), res.get('n_ref_filters', 0))
    return out + ')'


def read_sampling_meta(samples_path):
    """The sidecar `molgen sample` writes beside its output (SAMPLES.json:
    model, seed, temperature, top_k, top_p, constrain, ...), or None."""
    p = samples_path + '.json'
    if not os.path.isfile(p):
        return None
    try:
        with open(p) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        sys.stderr.write('molgen.metrics: %s: unreadable sampling sidecar (%s); ignored\n' % (p, e))
        return None
    return meta if isinstance(meta, dict) else None


def _fmt_sampling(meta):
    if not meta:
        return 'unknown (no SAMPLES.json from molgen sample beside the samples)'
    con = str(meta.get('constrain', '?'))
    if meta.get('constrain_method'):  # reject / mask (molgen sample --constrain-method)
        con += ' (%s)' % meta['constrain_method']
    return 'constrain %s, temperature %s, top-k %s, top-p %s, seed %s, model %s' % tuple(
        [con] + [meta.get(k, '?') for k in ('temperature', 'top_k', 'top_p', 'seed', 'model')])


def format_table(res):
    rows = [
        ('sampling', _fmt_sampling(res.get('sampling'))),
        ('samples', str(res['n_samples'])),
        ('valid', '%s  (%d / %d)' % (_fmt(res['validity']), res['n_valid'], res['n_samples'])),
        ('unique@1k', _fmt(res.get('unique@1k'))),
        ('unique@10k', _fmt(res.get('unique@10k'))),
        ('novelty', _fmt(res.get('novelty'))),
        ('Filters', _fmt_filters(res)),
        ('IntDiv1', _fmt(res.get('IntDiv1'))),
        ('IntDiv2', _fmt(res.get('IntDiv2'))),
        ('SNN/ref', _fmt(res.get('SNN'))),
        ('Frag/ref', _fmt(res.get('Frag'))),
        ('Scaf/ref', _fmt(res.get('Scaf'))),
    ]
    w = res.get('wasserstein') or {}
    for name in ('logP', 'SA', 'QED', 'weight'):
        rows.append(('W1 ' + name, _fmt(w.get(name)) if w else 'n/a'))
    for name, why in sorted((res.get('not_computed') or {}).items()):
        if name != 'Filters':
            rows.append((name, 'not computed: ' + why))
    width = max(len(r[0]) for r in rows)
    lines = ['%-*s  %s' % (width, k, v) for k, v in rows]
    for n in res.get('notes', []):
        lines.append('note: ' + n)
    t = res.get('timing', {})
    if 'total_s' in t:
        lines.append('time: %.1f s' % t['total_s'])
    return '\n'.join(lines)


def _nan_to_none(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


def format_guacamol(g, sc):
    from .guacamol import BASELINES, GPT_BASELINE
    rows = ['', 'GuacaMol distribution learning (n = %d; FCD %s)' % (g['n'], g['FCD_note']),
            '%-28s %9s %11s %8s %9s' % ('', 'validity', 'uniqueness', 'novelty', 'KL score'),
            '%-28s %9s %11s %8s %9s' % ('these samples', _fmt(g['validity'], 3),
                                        _fmt(g['uniqueness'], 3), _fmt(g['novelty'], 3),
                                        _fmt(g['kl_score'], 3))]
    for name, v in list(BASELINES.items())[:1] + [GPT_BASELINE]:
        rows.append('%-28s %9s %11s %8s %9s' % ((name,) + tuple(_fmt(x, 3) for x in v)))
    rows.append('KL divergences: ' + ', '.join('%s %.3f' % kv for kv in g['kl_divergences'].items()))
    for n in g['notes']:
        rows.append('note: ' + n)
    s, d = sc['samples'], sc.get('data')
    def line(name, x):
        return ('%-13s stereo %.3f, charged %.3f; stereocentres kept %d of %d, stereo double '
                'bonds kept %d of %d' % (name, x['stereo_share'], x['charge_share'],
                                         x['stereocentres_kept'], x['stereocentres_written'],
                                         x['stereo_bonds_kept'], x['stereo_bonds_written']))
    rows.append(line('samples', s))
    if d:
        rows.append(line('training data', d))
    return '\n'.join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.metrics',
        description='MOSES-style metrics of generated SMILES (validity, uniqueness, '
                    'novelty, Filters, IntDiv, SNN, Frag, Scaf, property W1; FCD is not '
                    'computed).')
    ap.add_argument('samples', help='generated SMILES, one per line (blank lines = '
                    'empty, invalid samples)')
    ap.add_argument('--train', help='training SMILES (.smi) for novelty')
    ap.add_argument('--ref', help='reference SMILES (.smi) for SNN / Frag / Scaf / W1')
    ap.add_argument('--json', help='also write the results as JSON to this file')
    ap.add_argument('--max-ref', type=int, default=MAX_REF_DEFAULT,
                    help='subsample the reference to at most N molecules (default %(default)s)')
    ap.add_argument('--max-gen', type=int, default=MAX_GEN_DEFAULT,
                    help='at most N valid samples (random) for IntDiv, SNN, Frag, Scaf and '
                         'W1 (default %(default)s)')
    ap.add_argument('--seed', type=int, default=0, help='seed of the subsampling')
    ap.add_argument('--jobs', type=int, default=os.cpu_count() or 1,
                    help='worker processes (default: all cores)')
    ap.add_argument('--no-ref-filters', action='store_true',
                    help='do not compute Filters of the reference (it depends on the reference '
                         'and --max-ref/--seed only: one run of several on the same reference '
                         'is enough)')
    ap.add_argument('--condition', help='NAME=VALUE,... requested properties (logp, qed, '
                    'sas, tpsa, mw): MAD and SD of the valid samples from each')
    ap.add_argument('--scaffold', help='requested scaffold SMILES: share of valid samples '
                    'with exactly its Murcko scaffold, mean scaffold Tanimoto')
    ap.add_argument('--guacamol', action='store_true',
                    help="also GuacaMol's distribution-learning scores (validity, uniqueness, "
                         'novelty, KL score over 10,000 molecules; needs --train) and the '
                         'shares of samples with stereo and with charges beside --train\'s')
    ap.add_argument('-q', '--quiet', action='store_true', help='no progress lines')
    args = ap.parse_args(argv)
    if args.guacamol and not args.train:
        sys.stderr.write('molgen.metrics: --guacamol needs --train (novelty and the KL '
                         'reference come from it)\n')
        return 2
    _require_deps()
    try:
        targets = parse_condition(args.condition) if args.condition else None
    except ValueError as e:
        sys.stderr.write('molgen.metrics: %s\n' % e)
        return 2
    for p in (args.samples, args.train, args.ref):
        if p is not None and not os.path.isfile(p):
            sys.stderr.write('molgen.metrics: no such file: %s\n' % p)
            return 2
    if args.max_ref < 1 or args.max_gen < 1:
        sys.stderr.write('molgen.metrics: --max-ref and --max-gen must be >= 1\n')
        return 2
    samples = read_smiles(args.samples, samples=True)
    # a trailing newline at the end of the file is not an extra sample
    while samples and samples[-1] == '':
        samples.pop()
    train = read_smiles(args.train) if args.train else None
    ref = read_smiles(args.ref) if args.ref else None
    log = None if args.quiet else (lambda m: sys.stderr.write('metrics: %s\n' % m))
    res = compute_metrics(samples, train, ref, max_ref=args.max_ref, max_gen=args.max_gen,
                          seed=args.seed, jobs=args.jobs, log=log,
                          ref_filters=not args.no_ref_filters)
    res['files'] = {'samples': args.samples, 'train': args.train, 'ref': args.ref}
    # which sampler settings (constrain mode included) made the samples
    res['sampling'] = read_sampling_meta(args.samples)
    if targets or args.scaffold is not None:
        valid = [c for c in _flat(_Mapper(1).map(_canon_many, samples)) if c is not None]
        try:
            res['condition'] = condition_metrics(valid, targets, args.scaffold, args.jobs)
        except ValueError as e:
            sys.stderr.write('molgen.metrics: %s\n' % e)
            return 2
    if args.guacamol:
        from . import guacamol
        if log:
            log('GuacaMol scores (KL over %d molecules)' % guacamol.GUACAMOL_N)
        pool = _Mapper(args.jobs)
        try:
            pm = pool.pool.map if pool.pool else None
            res['guacamol'] = guacamol.guacamol_scores(samples, train, seed=args.seed + 42,
                                                       map_chunks=pm)
            res['stereo_charge'] = guacamol.stereo_charge(
                samples, random.Random(args.seed).sample(train, min(len(train), 10000)),
                map_chunks=pm)
        finally:
            pool.close()
    print(format_table(res))
    if res.get('guacamol'):
        print(format_guacamol(res['guacamol'], res['stereo_charge']))
    if res.get('condition'):
        print(format_condition(res['condition']))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(_nan_to_none(res), f, indent=2, sort_keys=True)
            f.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
