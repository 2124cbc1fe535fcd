"""The scorer server of `molgen optimize --scorer`.

    /usr/bin/python3 -m molgen.scoring CONFIG.toml
    /usr/bin/python3 -m molgen.scoring --task pmo/NAME     (--list: the PMO tasks)
    /usr/bin/python3 -m molgen.scoring --check CONFIG.toml (parse, score probe molecules,
                                                           print the components)

Reads one SMILES per line on standard input (its first whitespace-separated
field) and writes exactly one line per input line, in order, flushed:
    SCORE<TAB>canonical=SMILES<TAB>NAME=VALUE...
SCORE is a decimal in [0, 1], written without an exponent; canonical is
RDKit's canonical SMILES (isomeric, as PMO's cache key); then each
component's score and, for one with a modifier, NAME_raw = its raw value.
A line that is not a molecule RDKit parses (or an empty one, or a molecule
on which a component fails: the reason goes to standard error) is answered
`nan`. A request
    !randomize<TAB>SEED<TAB>N<TAB>SMILES
is answered with N randomized SMILES of the molecule, TAB-separated, the
same for the same SEED in every run (molgen.scoring.randomized), or an empty
line when SMILES does not parse or the request is malformed (SEED an integer
>= 0, 1 <= N <= 10000). Exits 0 at the end of input; 2 on a bad
configuration, with a one-line message.
"""

import argparse
import math
import os
import sys

from . import ConfigError, load, pmo_tasks, format_result, randomized, Result, task_path

PROG = 'python3 -m molgen.scoring'
MAX_RANDOMIZE = 10000


def _warn(msg):
    sys.stderr.write('molgen.scoring: %s\n' % msg)
    sys.stderr.flush()


def _randomize(line):
    parts = line.split('\t')
    if len(parts) != 4:
        _warn('!randomize wants 3 TAB-separated fields SEED, N, SMILES; got %d' % (len(parts) - 1))
        return ''
    try:
        seed, n = int(parts[1]), int(parts[2])
    except ValueError:
        _warn('!randomize: SEED and N must be integers: %r, %r' % (parts[1], parts[2]))
        return ''
    if seed < 0 or not 1 <= n <= MAX_RANDOMIZE:
        _warn('!randomize: need SEED >= 0 and 1 <= N <= %d (got %d, %d)' % (MAX_RANDOMIZE, seed, n))
        return ''
    out = randomized(parts[3].strip(), n, seed)
    return '' if out is None else '\t'.join(out)


PROBES = ('c1ccc2ccccc2c1O', 'CC(=O)Nc1ccc(O)cc1', 'C')  # naphthol, paracetamol, methane


def probe(scorer):
    """--check: score a few molecules as the server would; a component that
    fails or gives no finite score in [0, 1] on them is a ConfigError."""
    for smi in PROBES:
        try:
            r = scorer.score(smi)
        except Exception as e:
            raise ConfigError('%s: scoring the probe molecule %s fails: %s: %s'
                              % (scorer.name, smi, type(e).__name__, e))
        if not (0.0 <= r.score <= 1.0):
            raise ConfigError('%s: the probe molecule %s scores %r, not a number in [0, 1]'
                              % (scorer.name, smi, r.score))


def answer(scorer, line):
    """The reply line (no newline) to one request line."""
    if line.startswith('!randomize'):
        return _randomize(line)
    f = line.split()
    smi = f[0] if f else ''
    try:
        return format_result(scorer.score(smi))
    except Exception as e:  # a component failing on one molecule must not end the run
        _warn('cannot score %r: %s: %s' % (smi, type(e).__name__, e))
        return format_result(Result(math.nan, None, []))


def serve(scorer, fin, fout):
    for raw in iter(fin.readline, b''):
        line = raw.decode('utf-8', 'replace').rstrip('\r\n')
        fout.write((answer(scorer, line) + '\n').encode('utf-8'))
        fout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(prog=PROG, description='Score SMILES from standard input, '
                                 'one reply line each (the molgen optimize scorer protocol)')
    ap.add_argument('config', nargs='?', help='scoring TOML file')
    ap.add_argument('--task', help='a shipped task instead: pmo/NAME (see --list)')
    ap.add_argument('--list', action='store_true', help='print the PMO task names and exit')
    ap.add_argument('--check', action='store_true',
                    help='parse the configuration, score probe molecules, print its components and exit')
    a = ap.parse_args(argv)
    if a.list:
        print('\n'.join('pmo/' + t for t in pmo_tasks()))
        return 0
    if (a.config is None) == (a.task is None):
        _warn('give one of CONFIG.toml or --task pmo/NAME')
        return 2
    try:
        import rdkit  # noqa: F401
    except ImportError:
        _warn('RDKit is not available (run with /usr/bin/python3; Debian python3-rdkit)')
        return 2
    try:
        if a.task is not None:
            if not a.task.startswith('pmo/'):
                raise ConfigError('--task %r: the tasks are pmo/NAME (see --list)' % a.task)
        # --task: the shipped file itself (task_path), never ./pmo/NAME
        scorer = load(task_path(a.task) if a.task is not None else a.config)
        if a.check:
            probe(scorer)
    except ConfigError as e:
        _warn(str(e))
        return 2
    if a.check:
        print('%s: %s mean of %d component(s)' % (scorer.name, scorer.aggregate, len(scorer.entries)))
        for e in scorer.entries:
            print('  %s (%s) weight %g%s' % (e.name, e.comp.kind, e.weight,
                                             ''.join(' -> %s' % m.kind for m in e.mods)))
        return 0
    try:
        serve(scorer, sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:
        # the client went away: nothing left to answer (and nothing to flush at exit)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == '__main__':
    sys.exit(main())
