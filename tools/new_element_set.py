#!/usr/bin/python3
"""A fine-tuning set with an element a prior has never seen, for
`molgen train --init PRIOR --extend-vocab` (docs/molgen.md, fine-tuning).

    new_element_set.py SRC.smi OUT.smi [--element B|I] [-n 300] [--seed 1]
        [--max-tokens 50] [--heldout FILE]

Reads SRC (first field per line), keeps molecules of MOSES's elements (C, N,
O, S, F, Cl, Br) with an aromatic Cl or Br and no stereo or charge, and
replaces that halogen (the first match):
  B  by a boronic acid B(O)O (Suzuki building blocks; the token 'B')
  I  by iodine (the token 'I')
  Cl by chlorine: the same molecules without a new element (a control)
writes n RDKit-canonical products of at most --max-tokens tokens (shuffled
by --seed; each parses and holds the element) and, with --heldout, the
next n to FILE. Needs RDKit (/usr/bin/python3)."""
import argparse
import random
import re
import sys

from rdkit import Chem, RDLogger

RDLogger.DisableLog("rdApp.*")
TOKEN = re.compile(r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|/|:|~|@|\?|>|\*|\$|%[0-9]{2}|[0-9])")
HALO = Chem.MolFromSmarts("c[Cl,Br]")
PRODUCT = {"B": "B(O)O", "I": "I", "Cl": "Cl"}


MOSES_ELEMENTS = {"C", "N", "O", "S", "F", "Cl", "Br", "H"}


def convert(smi, element):
    m = Chem.MolFromSmiles(smi)
    if m is None or not m.HasSubstructMatch(HALO):
        return None
    if any(a.GetSymbol() not in MOSES_ELEMENTS for a in m.GetAtoms()):
        return None  # only the new element is new
    rw = Chem.RWMol(m)
    _, x = m.GetSubstructMatch(HALO)  # one halogen: the first match
    if element in ("I", "Cl"):
        rw.GetAtomWithIdx(x).SetAtomicNum(53 if element == "I" else 17)
    else:
        rw.GetAtomWithIdx(x).SetAtomicNum(5)
        for _ in range(2):
            o = rw.AddAtom(Chem.Atom(8))
            rw.AddBond(x, o, Chem.BondType.SINGLE)
    try:
        Chem.SanitizeMol(rw)
    except Exception:
        return None
    out = Chem.MolToSmiles(rw)
    back = Chem.MolFromSmiles(out)
    if back is None or not any(a.GetSymbol() == element for a in back.GetAtoms()):
        return None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("out")
    ap.add_argument("--element", choices=sorted(PRODUCT), default="B")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=50)
    ap.add_argument("--heldout")
    a = ap.parse_args()
    lines = [l.split()[0] for l in open(a.src) if l.strip() and not l.startswith("#")]
    random.Random(a.seed).shuffle(lines)
    want = a.n * (2 if a.heldout else 1)
    got, seen = [], set()
    for smi in lines:
        if "@" in smi or "+" in smi or "-]" in smi or "/" in smi or "\\" in smi:
            continue
        p = convert(smi, a.element)
        if p and p not in seen and len(TOKEN.findall(p)) <= a.max_tokens:
            seen.add(p)
            got.append(p)
            if len(got) == want:
                break
    if len(got) < want:
        sys.exit(f"only {len(got)} molecules of {a.src} convert (wanted {want})")
    with open(a.out, "w") as f:
        f.write("".join(s + "\n" for s in got[: a.n]))
    if a.heldout:
        with open(a.heldout, "w") as f:
            f.write("".join(s + "\n" for s in got[a.n:]))
    print(f"{a.out}: {a.n} molecules with {a.element}" + (f"; {a.heldout}: {a.n}" if a.heldout else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
