"""The conditional model's evaluation (README, "Conditional generation"):

    /usr/bin/python3 -m molgen.cond_eval MODEL DATA.csv OUT_DIR [-n 10000]
        [--scaffolds 10] [--unseen FILE.smi] [--scaffold-n 1000] [--threads 2]

1. Each trained property alone at its 10th, 50th and 90th percentile in
   DATA.csv (molgen.props's CSV): N samples each (molgen sample --condition),
   MAD / SD of the property from the target, validity, unique@N (molgen.metrics).
2. All four together at three combinations (medians; low logP with high
   TPSA; high logP with low TPSA): the same.
3. Scaffolds (a scaffold model): the most frequent --scaffolds scaffolds of
   DATA.csv after the 10 most frequent (so not only benzene-like ones),
   and the scaffolds of --unseen's molecules that no row of DATA.csv has;
   --scaffold-n samples each: exact-scaffold share, scaffold Tanimoto,
   validity, uniqueness.
4. The histogram picture of step 1 (molgen.pictures, the first 2,000 samples
   of each target).
Writes OUT_DIR/summary.json and prints a Markdown table. Seeds are fixed
(7 + the run's index), so a rerun gives the same samples for the same
threads."""
import argparse
import collections
import csv
import json
import os
import shutil
import subprocess
import sys

from molgen import props

HERE = os.path.dirname(os.path.abspath(__file__))
# the child `python3 -m molgen.metrics|pictures` finds this same package
CHILD_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(HERE)] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
PROPS = ['logp', 'qed', 'sas', 'tpsa']


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = int(k)
    return xs[f] + (xs[min(f + 1, len(xs) - 1)] - xs[f]) * (k - f)


def default_molgen():
    """$MOLGEN, else the source tree's build/molgen/molgen, else molgen on PATH."""
    tree = os.path.join(HERE, os.pardir, os.pardir, 'build', 'molgen', 'molgen')
    if os.environ.get('MOLGEN'):
        return os.environ['MOLGEN']
    return tree if os.access(tree, os.X_OK) else (shutil.which('molgen') or 'molgen')


def run(cmd, may_refuse=False):
    p = subprocess.run(cmd, capture_output=True, text=True, env=CHILD_ENV)
    if p.returncode == 2 and may_refuse:  # molgen's refusal of a request
        return p
    if p.returncode != 0:
        sys.stderr.write(p.stderr)
        raise SystemExit('failed: %s' % ' '.join(cmd))
    return p


def main():
    ap = argparse.ArgumentParser(prog='python3 -m molgen.cond_eval')
    ap.add_argument('model')
    ap.add_argument('data')
    ap.add_argument('out')
    ap.add_argument('-n', type=int, default=10000)
    ap.add_argument('--scaffolds', type=int, default=10)
    ap.add_argument('--unseen', help='.smi whose scaffolds (those not in DATA) are tried')
    ap.add_argument('--unseen-max', type=int, default=5)
    ap.add_argument('--scaffold-n', type=int, default=1000)
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('--molgen', default=default_molgen())
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows = list(csv.DictReader(open(a.data)))
    pct = {k: [percentile([float(r[k]) for r in rows], q) for q in (0.1, 0.5, 0.9)]
           for k in PROPS if k in rows[0]}
    fmt = {'logp': '%.2f', 'qed': '%.3f', 'sas': '%.2f', 'tpsa': '%.1f'}
    with open(a.model, 'rb') as f:  # the safetensors header: its "config" metadata
        header = json.loads(f.read(int.from_bytes(f.read(8), 'little')))
    cfg = json.loads(header['__metadata__']['config'])
    jobs = []  # (kind, label, condition text or None, scaffold or None, n)
    for k in (PROPS if cfg.get('n_cond') else []):
        for q, v in zip((10, 50, 90), pct[k]):
            jobs.append(('single', '%s p%d' % (k, q), '%s=%s' % (k, fmt[k] % v), None, a.n))
    med = {k: pct[k][1] for k in PROPS}
    combos = [dict(med), dict(med, logp=pct['logp'][0], tpsa=pct['tpsa'][2]),
              dict(med, logp=pct['logp'][2], tpsa=pct['tpsa'][0])]
    for i, c in enumerate(combos if cfg.get('n_cond') else []):
        jobs.append(('all four', 'combination %d' % (i + 1),
                     ','.join('%s=%s' % (k, fmt[k] % c[k]) for k in PROPS), None, a.n))
    if cfg.get('scaffold'):
        counts = collections.Counter(r.get('scaffold') for r in rows if r.get('scaffold'))
        for s, c in counts.most_common(10 + a.scaffolds)[10:]:
            jobs.append(('scaffold, in training', '%s (%d rows)' % (s, c), None, s, a.scaffold_n))
        if a.unseen:
            from rdkit import Chem
            seen = set(counts)
            new = []
            for line in open(a.unseen):
                smi = line.split()[0] if line.split() else ''
                mol = Chem.MolFromSmiles(smi) if smi else None
                sc = props.murcko_scaffold(mol) if mol is not None else None
                if sc and sc not in seen and sc not in new and len(sc) <= 40:
                    new.append(sc)
                if len(new) >= 4 * a.unseen_max:  # some have tokens the model lacks
                    break
            for s in new:
                jobs.append(('scaffold, never seen', s, None, s, a.scaffold_n))
    results = []
    unseen_done = 0
    for i, (kind, label, cond, scaf, n) in enumerate(jobs):
        unseen = kind == 'scaffold, never seen'
        if unseen and unseen_done >= a.unseen_max:
            continue
        smi = os.path.join(a.out, 's%02d.smi' % i)
        js = os.path.join(a.out, 's%02d.json' % i)
        done = os.path.exists(js) and os.path.exists(smi + '.json')  # a rerun keeps them
        cmd = [a.molgen, 'sample', '--model', a.model, '-n', str(n), '--seed', str(7 + i),
               '--threads', str(a.threads), '--out', smi]
        if cond:
            cmd += ['--condition', cond]
        if scaf:
            cmd += ['--scaffold', scaf]
        p = None if done else run(cmd, may_refuse=unseen)
        if p is not None and p.returncode == 2:  # a token outside the vocabulary
            print('%-22s %-44s refused: %s' % (kind, label, p.stderr.strip().splitlines()[-1]),
                  flush=True)
            results.append({'kind': kind, 'label': label, 'scaffold': scaf,
                            'refused': p.stderr.strip().splitlines()[-1]})
            continue
        unseen_done += unseen
        rate = [ln for ln in p.stderr.splitlines() if ln.startswith('sampled')] if p else []
        mcmd = [sys.executable, '-m', 'molgen.metrics', smi, '--json', js,
                '--jobs', str(a.threads), '-q']
        if cond:
            mcmd += ['--condition', cond]
        if scaf:
            mcmd += ['--scaffold', scaf]
        if not done:
            run(mcmd)
        m = json.load(open(js))
        r = {'kind': kind, 'label': label, 'condition': cond, 'scaffold': scaf, 'n': n,
             'samples': smi, 'sampling': rate[0] if rate else None,
             'validity': m.get('validity'),
             'unique': m.get('unique@10k') if n >= 10000 else m.get('unique@1k'),
             'metrics': m.get('condition')}
        results.append(r)
        print('%-22s %-44s validity %.3f %s' % (kind, label, r['validity'] or 0,
                                                json.dumps(r['metrics'])[:160]), flush=True)
    json.dump({'model': a.model, 'percentiles': pct, 'results': results},
              open(os.path.join(a.out, 'summary.json'), 'w'), indent=1)
    series = []  # the picture from the first 2,000 samples of each target (props take ~7 ms each)
    for r in results:
        if r['kind'] != 'single':
            continue
        head = r['samples'].replace('.smi', '_2k.smi')
        with open(r['samples']) as f, open(head, 'w') as g:
            g.writelines(f.readlines()[:2000])
        series.append('%s:%s' % (r['condition'], head))
    if not series:
        return
    run([sys.executable, '-m', 'molgen.pictures', '--data', a.data, '--out',
         os.path.join(a.out, 'conditional.svg')] + series)


if __name__ == '__main__':
    main()
