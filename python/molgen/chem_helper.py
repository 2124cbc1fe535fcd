"""molgen's chemistry helper: the process `molgen optimize` starts beside the
user's scorer for what needs RDKit, so that every lever works with a scorer
that answers one number per line and nothing else.

    /usr/bin/python3 -m molgen.chem_helper

Reads one request per line on standard input and writes exactly one reply
line per request, in order, flushed (TAB separates fields):

    hello                        -> molgen-chem-helper<TAB>1<TAB>rdkit VERSION
    canon<TAB>SMILES             -> RDKit's canonical isomeric SMILES (the
                                    budget and cache key, as PMO counts), or
                                    an empty line when RDKit cannot parse it
                                    or cannot write it
    randomize<TAB>SEED<TAB>N<TAB>SMILES
                                 -> N randomized SMILES, TAB-separated (the
                                    same for the same SEED), or an empty line
                                    when SMILES does not parse
    offspring<TAB>SEED<TAB>RATE<TAB>A1<TAB>B1[<TAB>A2<TAB>B2 ...]
                                 -> one field per parent pair: the child of
                                    Ai and Bi (molgen.graph_ga.reproduce with
                                    mutation rate RATE), empty where none
                                    passed the checks; the pairs' children
                                    depend on SEED and the pairs only

RDKit raises on some molecules it has parsed (RuntimeError "Pre-condition
Violation" from MolToSmiles, e.g. a stereo bond mark next to S(=O)=C): such
a molecule gets the reply of one RDKit cannot parse (an empty line, an
empty field for a pair), never a stopped helper.

A request it cannot read (unknown verb, wrong field count, SEED not an
integer >= 0, N outside 1..10000, RATE outside [0, 1]) is answered
`!error<TAB>MESSAGE`, which molgen reports and stops on. Exits 0 at the end
of input. Without RDKit it writes one line to standard error and exits 3
before reading anything (molgen names the missing package).
"""

import random
import sys

PROG = 'python3 -m molgen.chem_helper'
PROTOCOL = 1
MAX_N = 10000
MAX_PAIRS = 4096


class RequestError(ValueError):
    pass


def _int(text, what, lo, hi):
    try:
        v = int(text)
    except ValueError:
        raise RequestError('%s must be an integer, got %r' % (what, text))
    if not lo <= v <= hi:
        raise RequestError('%s must be in [%d, %d], got %d' % (what, lo, hi, v))
    return v


def _canon(f):
    from rdkit import Chem
    if len(f) != 2:
        raise RequestError('canon wants 1 field SMILES; got %d' % (len(f) - 1))
    smiles = f[1].strip()
    if not smiles:
        return ''
    try:
        m = Chem.MolFromSmiles(smiles)
        return '' if m is None else Chem.MolToSmiles(m)
    except Exception:  # RDKit's pre-condition violations: see the docstring
        return ''


def _randomize(f):
    from .scoring import randomized
    if len(f) != 4:
        raise RequestError('randomize wants 3 fields SEED, N, SMILES; got %d' % (len(f) - 1))
    seed = _int(f[1], 'SEED', 0, 2 ** 63 - 1)
    n = _int(f[2], 'N', 1, MAX_N)
    out = randomized(f[3].strip(), n, seed)  # None too where RDKit cannot write it
    return '' if out is None else '\t'.join(out)


def _offspring(f):
    from . import graph_ga
    if len(f) < 5 or (len(f) - 3) % 2:
        raise RequestError('offspring wants SEED, RATE and pairs of parents; got %d fields'
                           % (len(f) - 1))
    seed = _int(f[1], 'SEED', 0, 2 ** 63 - 1)
    try:
        rate = float(f[2])
    except ValueError:
        raise RequestError('RATE must be a number, got %r' % f[2])
    if not 0.0 <= rate <= 1.0:
        raise RequestError('RATE must be in [0, 1], got %r' % f[2])
    parents = f[3:]
    if len(parents) // 2 > MAX_PAIRS:
        raise RequestError('at most %d pairs per request, got %d' % (MAX_PAIRS, len(parents) // 2))
    # one generator per pair, seeded from (SEED, pair index): a child does not
    # depend on how the other pairs went (a failed pair draws more numbers)
    out = []
    for i in range(0, len(parents), 2):
        rng = random.Random(seed * 1000003 + i // 2)
        try:
            child = graph_ga.reproduce(parents[i].strip(), parents[i + 1].strip(), rng, rate)
        except Exception:  # the operators' RDKit edits: see the docstring
            child = None
        out.append(child or '')
    return '\t'.join(out)


def _hello(f):
    import rdkit
    return 'molgen-chem-helper\t%d\trdkit %s' % (PROTOCOL, rdkit.__version__)


VERBS = {'hello': _hello, 'canon': _canon, 'randomize': _randomize, 'offspring': _offspring}


def answer(line):
    """The reply line (no newline) to one request line."""
    f = line.split('\t')
    verb = VERBS.get(f[0])
    if verb is None:
        return '!error\tunknown request %r (want %s)' % (f[0][:40], ', '.join(sorted(VERBS)))
    try:
        return verb(f)
    except RequestError as e:
        return '!error\t%s: %s' % (f[0], e)


def serve(fin, fout):
    for raw in iter(fin.readline, b''):
        line = raw.decode('utf-8', 'replace').rstrip('\r\n')
        fout.write((answer(line) + '\n').encode('utf-8'))
        fout.flush()


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if args:
        sys.stderr.write('usage: %s (requests on standard input; see its docstring)\n' % PROG)
        return 2
    try:
        from rdkit import Chem, RDLogger  # noqa: F401
    except ImportError:
        sys.stderr.write('%s: RDKit is not installed (Debian: apt-get install python3-rdkit); '
                         'molgen optimize needs it for --ga, --augmented-memory and canonical '
                         'budget keys\n' % PROG)
        return 3
    RDLogger.DisableLog('rdApp.*')
    serve(sys.stdin.buffer, sys.stdout.buffer)
    return 0


if __name__ == '__main__':
    sys.exit(main())
