"""Molecules that share a motif, by RDKit substructure (SMARTS).

    /usr/bin/python3 -m molgen.motif_set pick --data FILE.smi --smarts S --n N
            [--seed K] --out OUT.smi
        every molecule of FILE (first field per line) that RDKit parses and
        that contains S; N of them drawn at random (seeded) in file order to
        OUT (all of them when there are fewer); prints how many matched.
    /usr/bin/python3 -m molgen.motif_set share SAMPLES.smi --smarts S
        the share of the sample lines that are valid molecules carrying the
        motif (over all lines, as validity; and over the valid ones).

Used for molgen's fine-tuning demonstration (README, "Fine-tuning"). Needs
RDKit (Debian python3-rdkit)."""
import argparse
import random
import sys

try:
    from rdkit import Chem, RDLogger
except ImportError:
    print("molgen.motif_set: needs RDKit (apt-get install python3-rdkit; use /usr/bin/python3)",
          file=sys.stderr)
    sys.exit(2)


def first_fields(path):
    with open(path) as f:
        for line in f:
            yield line.split()[0] if line.strip() else ""


def pattern(smarts):
    p = Chem.MolFromSmarts(smarts)
    if p is None:
        sys.exit("molgen.motif_set: cannot parse SMARTS %r" % smarts)
    return p


def pick(a):
    p = pattern(a.smarts)
    hits, n = [], 0
    for s in first_fields(a.data):
        if not s:
            continue
        n += 1
        m = Chem.MolFromSmiles(s)
        if m is not None and m.HasSubstructMatch(p):
            hits.append(s)
    if not hits:
        sys.exit("molgen.motif_set: no molecule of %s contains %s" % (a.data, a.smarts))
    keep = sorted(random.Random(a.seed).sample(range(len(hits)), min(a.n, len(hits))))
    with open(a.out, "w") as f:
        for i in keep:
            f.write(hits[i] + "\n")
    print("%s: %d molecules, %d contain %s (%.2f%%); wrote %d to %s"
          % (a.data, n, len(hits), a.smarts, 100.0 * len(hits) / n, len(keep), a.out))


def share(a):
    p = pattern(a.smarts)
    lines = list(first_fields(a.samples))
    while lines and not lines[-1]:
        lines.pop()
    valid = motif = 0
    for s in lines:
        m = Chem.MolFromSmiles(s) if s else None
        if m is None or m.GetNumAtoms() == 0:
            continue
        valid += 1
        motif += m.HasSubstructMatch(p)
    print("%s: %d samples, %d valid, %d with %s: %.4f of all, %.4f of the valid"
          % (a.samples, len(lines), valid, motif, a.smarts, motif / max(len(lines), 1),
             motif / max(valid, 1)))


def main():
    RDLogger.DisableLog("rdApp.*")
    ap = argparse.ArgumentParser(prog='python3 -m molgen.motif_set',
                                     description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    k = sub.add_parser("pick", help="a random N of the molecules with the motif")
    k.add_argument("--data", required=True)
    k.add_argument("--smarts", required=True)
    k.add_argument("--n", type=int, required=True)
    k.add_argument("--seed", type=int, default=1)
    k.add_argument("--out", required=True)
    s = sub.add_parser("share", help="the motif's share of a sample file")
    s.add_argument("samples")
    s.add_argument("--smarts", required=True)
    a = ap.parse_args()
    pick(a) if a.mode == "pick" else share(a)


if __name__ == "__main__":
    main()
