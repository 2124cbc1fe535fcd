"""Graph genetic operators on molecules (Jensen 2019, "A graph-based genetic
algorithm and generative model/Monte Carlo tree search for the exploration of
chemical space", Chem. Sci. 10, 3567): crossover of two parents by cutting
each into two pieces and joining a piece of one to a piece of the other, and
mutation by one local edit of the graph. Genetic GFN (Kim et al. 2024) uses
them to propose offspring of the best molecules found so far; molgen's
helper process (molgen.chem_helper) runs them for `molgen optimize`.

Written for molgen on RDKit, after the paper's description; every choice
draws from the `random.Random` passed in, so a seed fixes the offspring
(`molgen optimize --resume` repeats a step bit for bit).

    child = reproduce(parent_a, parent_b, rng, mutation_rate)  # SMILES or None

Crossover (one of the two, with equal odds when both parents have rings):
  - chain: cut one acyclic single bond of each parent; join one side of A's
    cut to one side of B's.
  - ring: cut two bonds of one ring of each parent; join the arc of A's ring
    that one piece holds to the complementary piece of B (a new ring).
Mutation (one of seven edits, each a graph change RDKit must sanitize):
append an atom, insert an atom into a chain bond, change a bond's order,
delete a ring bond, close a ring of 3 to 6 atoms, delete an atom (bridging
its two neighbours), change an element.

A child is kept when RDKit sanitizes it, it is one molecule (no '.'), its
rings hold 3 to 8 atoms with no double bond in a 3- or 4-ring and no
ring atom with two double bonds, and it has at most `max_heavy` heavy atoms.
Molecules are edited in Kekulé form (an aromatic ring cut in two has no
aromaticity to keep); the child's SMILES is RDKit's canonical, isomeric one
(stereo tags that no longer name a stereocentre are dropped).
"""

from rdkit import Chem, RDLogger

RDLogger.DisableLog('rdApp.*')

MAX_HEAVY = 70   # ZINC250k's largest molecule has 38 heavy atoms; PMO's targets <= 50
TRIES = 10       # attempts per crossover kind and per mutation before giving up

# elements an edit may add, with their weights (Jensen's mutation tables
# favour carbon, then N and O; halogens and S as substituents)
_NEW_ATOMS = (('C', 8), ('N', 3), ('O', 3), ('S', 1), ('F', 1), ('Cl', 1), ('Br', 0.5))
_RING_ATOMS = (('C', 8), ('N', 3), ('O', 2), ('S', 1))   # may sit inside a chain or ring
_SINGLE, _DOUBLE, _TRIPLE = (Chem.BondType.SINGLE, Chem.BondType.DOUBLE,
                             Chem.BondType.TRIPLE)
_ORDER = {_SINGLE: 1, _DOUBLE: 2, _TRIPLE: 3}


def _pick(rng, table):
    """One symbol of a (symbol, weight) table."""
    total = sum(w for _, w in table)
    x = rng.random() * total
    for sym, w in table:
        x -= w
        if x < 0:
            return sym
    return table[-1][0]


def _kekule(mol):
    """A copy of mol in Kekulé form without aromatic flags, or None."""
    m = Chem.Mol(mol)
    try:
        Chem.Kekulize(m, clearAromaticFlags=True)
    except Exception:
        return None
    return m


def ring_ok(mol):
    """Of a Kekulé molecule: rings of 3..8 atoms; no double bond inside a 3- or 4-ring; no ring
    atom with two double bonds (an allene in a ring)."""
    ri = mol.GetRingInfo()
    for ring in ri.AtomRings():
        if not 3 <= len(ring) <= 8:
            return False
    for bond in mol.GetBonds():
        if bond.GetBondType() == _DOUBLE and bond.IsInRing():
            if bond.IsInRingSize(3) or bond.IsInRingSize(4):
                return False
    for atom in mol.GetAtoms():
        if atom.IsInRing():
            doubles = sum(1 for b in atom.GetBonds() if b.GetBondType() == _DOUBLE)
            if doubles > 1:
                return False
    return True


def finish(mol, max_heavy=MAX_HEAVY):
    """The canonical SMILES of an edited molecule if it passes the checks of
    the module docstring, else None."""
    if mol is None:
        return None
    try:
        m = Chem.Mol(mol)
        Chem.SanitizeMol(m)
        Chem.AssignStereochemistry(m, cleanIt=True, force=True)
    except Exception:
        return None
    if m.GetNumHeavyAtoms() == 0 or m.GetNumHeavyAtoms() > max_heavy:
        return None
    # the ring checks read bond orders: on the Kekulé form (sanitizing made
    # the aromatic bonds AROMATIC, hiding a double bond in a 3-ring)
    k = _kekule(m)
    if len(Chem.GetMolFrags(m)) != 1 or k is None or not ring_ok(k):
        return None
    # written, read back and written again: the string must parse (a rare
    # sanitized-but-unwritable valence state would otherwise reach the
    # scorer), and an edited molecule's first string is not always the
    # canonical one of the molecule it spells; RDKit also raises on some
    # molecules it sanitized (a pre-condition violation in MolToSmiles)
    try:
        back = Chem.MolFromSmiles(Chem.MolToSmiles(m))
        return Chem.MolToSmiles(back) if back is not None else None
    except Exception:
        return None


def _pieces(mol, bond_ids):
    """mol cut on bond_ids, each cut's two ends marked by dummy atoms with the
    atom-map number of the cut (1, 2, ...): the pieces, or None unless the
    cuts leave exactly two."""
    labels = [(i + 1, i + 1) for i in range(len(bond_ids))]
    frag = Chem.FragmentOnBonds(mol, bond_ids, addDummies=True, dummyLabels=labels)
    for atom in frag.GetAtoms():
        if atom.GetAtomicNum() == 0:
            atom.SetAtomMapNum(atom.GetIsotope())
            atom.SetIsotope(0)
    pieces = Chem.GetMolFrags(frag, asMols=True, sanitizeFrags=False)
    return pieces if len(pieces) == 2 else None


def _join(a, b):
    """Join two pieces at their dummy atoms of equal map number (Chem.molzip)."""
    try:
        return Chem.molzip(a, b)
    except Exception:
        return None


def _chain_cut(mol, rng):
    bonds = [b.GetIdx() for b in mol.GetBonds()
             if not b.IsInRing() and b.GetBondType() == _SINGLE]
    return _pieces(mol, [rng.choice(bonds)]) if bonds else None


def _ring_cut(mol, rng):
    """Two bonds of one ring: (r_i, r_i+1) and (r_j, r_j+1), j != i."""
    rings = mol.GetRingInfo().BondRings()
    if not rings:
        return None
    ring = rng.choice(rings)
    i, j = rng.sample(range(len(ring)), 2)
    return _pieces(mol, [ring[i], ring[j]])


def crossover(a, b, rng, max_heavy=MAX_HEAVY):
    """A child of RDKit molecules a and b (canonical SMILES) or None."""
    ka, kb = _kekule(a), _kekule(b)
    if ka is None or kb is None:
        return None
    both_rings = ka.GetRingInfo().NumRings() > 0 and kb.GetRingInfo().NumRings() > 0
    cut = _ring_cut if both_rings and rng.random() < 0.5 else _chain_cut
    for _ in range(TRIES):
        pa, pb = cut(ka, rng), cut(kb, rng)
        if pa is None or pb is None:
            continue
        child = finish(_join(pa[rng.randrange(2)], pb[rng.randrange(2)]), max_heavy)
        if child is not None:
            return child
    return None


# --- mutations: each takes a Kekulé RWMol and a Random, edits it in place,
# and returns False when the molecule offers no site for the edit.

def _free_h(atom):
    return atom.GetTotalNumHs() > 0


def _append_atom(m, rng):
    sites = [a.GetIdx() for a in m.GetAtoms() if _free_h(a)]
    if not sites:
        return False
    at = rng.choice(sites)
    sym = _pick(rng, _NEW_ATOMS)
    order = _SINGLE
    if sym in ('C', 'N', 'O', 'S') and m.GetAtomWithIdx(at).GetTotalNumHs() >= 2:
        order = rng.choice((_SINGLE, _SINGLE, _SINGLE, _DOUBLE))
    new = m.AddAtom(Chem.Atom(sym))
    m.AddBond(at, new, order)
    return True


def _insert_atom(m, rng):
    bonds = [b for b in m.GetBonds() if b.GetBondType() == _SINGLE]
    if not bonds:
        return False
    bond = rng.choice(bonds)
    i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
    m.RemoveBond(i, j)
    new = m.AddAtom(Chem.Atom(_pick(rng, _RING_ATOMS)))
    m.AddBond(i, new, _SINGLE)
    m.AddBond(new, j, _SINGLE)
    return True


def _change_bond_order(m, rng):
    bonds = [b for b in m.GetBonds() if b.GetBondType() in _ORDER]
    if not bonds:
        return False
    bond = rng.choice(bonds)
    bond.SetBondType(rng.choice([t for t in (_SINGLE, _DOUBLE, _TRIPLE)
                                 if t != bond.GetBondType()]))
    return True


def _delete_ring_bond(m, rng):
    bonds = [b for b in m.GetBonds() if b.IsInRing()]
    if not bonds:
        return False
    bond = rng.choice(bonds)
    m.RemoveBond(bond.GetBeginAtomIdx(), bond.GetEndAtomIdx())
    return True


def _add_ring(m, rng):
    """Bond two atoms 2..5 bonds apart that both carry H: a ring of 3..6."""
    dist = Chem.GetDistanceMatrix(m)
    n = m.GetNumAtoms()
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)
             if 2 <= dist[i][j] <= 5 and _free_h(m.GetAtomWithIdx(i))
             and _free_h(m.GetAtomWithIdx(j))]
    if not pairs:
        return False
    i, j = rng.choice(pairs)
    m.AddBond(i, j, _SINGLE)
    return True


def _delete_atom(m, rng):
    """Delete an atom of degree 1, or of degree 2 bridging its neighbours."""
    sites = [a.GetIdx() for a in m.GetAtoms() if a.GetDegree() in (1, 2)]
    if not sites or m.GetNumAtoms() < 2:
        return False
    at = rng.choice(sites)
    nbrs = [x.GetIdx() for x in m.GetAtomWithIdx(at).GetNeighbors()]
    if len(nbrs) == 2 and m.GetBondBetweenAtoms(nbrs[0], nbrs[1]) is None:
        m.AddBond(nbrs[0], nbrs[1], _SINGLE)
    m.RemoveAtom(at)
    return True


def _change_atom(m, rng):
    sites = [a.GetIdx() for a in m.GetAtoms() if a.GetFormalCharge() == 0]
    if not sites:
        return False
    atom = m.GetAtomWithIdx(rng.choice(sites))
    table = _NEW_ATOMS if atom.GetDegree() == 1 else _RING_ATOMS
    choices = [(s, w) for s, w in table if s != atom.GetSymbol()]
    atom.SetAtomicNum(Chem.GetPeriodicTable().GetAtomicNumber(_pick(rng, choices)))
    atom.SetNoImplicit(False)
    atom.SetNumExplicitHs(0)
    atom.SetChiralTag(Chem.ChiralType.CHI_UNSPECIFIED)
    return True


MUTATIONS = (_append_atom, _insert_atom, _change_bond_order, _delete_ring_bond,
             _add_ring, _delete_atom, _change_atom)


def mutate(mol, rng, max_heavy=MAX_HEAVY):
    """One random edit of an RDKit molecule: canonical SMILES or None."""
    k = _kekule(mol)
    if k is None:
        return None
    for _ in range(TRIES):
        m = Chem.RWMol(k)
        edit = rng.choice(MUTATIONS)
        if not edit(m, rng):
            continue
        child = finish(m, max_heavy)
        if child is not None:
            return child
    return None


def reproduce(smiles_a, smiles_b, rng, mutation_rate, max_heavy=MAX_HEAVY):
    """An offspring of two parents given as SMILES: crossover, then with
    probability mutation_rate one mutation (kept only if it succeeds).
    The child's canonical SMILES, or None when the parents do not parse or
    no crossover passes the checks."""
    a, b = Chem.MolFromSmiles(smiles_a), Chem.MolFromSmiles(smiles_b)
    if a is None or b is None:
        return None
    child = crossover(a, b, rng, max_heavy)
    if child is not None and rng.random() < mutation_rate:
        mutated = mutate(Chem.MolFromSmiles(child), rng, max_heavy)
        if mutated is not None:
            child = mutated
    return child
