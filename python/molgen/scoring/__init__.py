"""molgen.scoring: multi-component molecule scores for `molgen optimize`.

A score is configured in TOML (Python 3.11's tomllib):

    name = "osimertinib_mpo"          # optional, shown in messages
    aggregate = "geometric"           # or "arithmetic" (default geometric)

    [[component]]
    kind = "similarity"               # see molgen.scoring.components
    name = "sim_fcfp4"                # optional; default: the kind (kind_2, ... if repeated)
    target = "COc1cc(N(C)CCN(C)C)c(NC(=O)C=C)cc1Nc1nccc(-c2cn(C)c3ccccc23)n1"
    fingerprint = "FCFP4"
    modifier = { kind = "clipped", upper_x = 0.8 }   # see molgen.scoring.modifiers
    weight = 1.0                      # optional, > 0 (default 1)

    [[component]]
    kind = "tpsa"
    modifier = { kind = "max_gaussian", mu = 100, sigma = 10 }

A component's score is modifier(raw) (or raw for the kinds whose raw value is
already in [0, 1]; the others need a modifier), clipped to [0, 1]. A modifier
parameter written P_of = "SMILES" takes the component's raw value on that
molecule (e.g. mu_of = sitagliptin: a Gaussian around sitagliptin's logP, as
GuacaMol computes it). `modifier` may also be a list of tables, applied in
order. The molecule's score aggregates the component scores s_i with weights w_i:
    arithmetic  sum(w_i s_i) / sum(w_i)
    geometric   prod(s_i ^ w_i) ^ (1 / sum(w_i))   (0 if any s_i is 0)

Library: load(path_or_task) -> Scorer; Scorer.score(smiles) -> Result;
score_smiles(config, smiles_list) -> [float] (nan for a molecule that cannot
be scored). The server (python3 -m molgen.scoring) is in __main__.py.
"""

import math
import os
import re
from collections import namedtuple

from .modifiers import ConfigError, make_modifier
from .components import COMPONENTS
from ..props import murcko_scaffold

PMO_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'pmo')
_NAME = re.compile(r'[A-Za-z0-9_.-]+')

# score: float in [0, 1] or nan; canonical: RDKit canonical SMILES or None;
# components: [(name, value)] — each component's score and, when it has a
# modifier, NAME_raw = its raw value; scaffold: the Bemis-Murcko scaffold's
# canonical SMILES ('' for an acyclic molecule) or None, the key of
# molgen optimize's scaffold diversity filter
Result = namedtuple('Result', 'score canonical components scaffold', defaults=(None,))


def pmo_tasks():
    """Names of the PMO oracles shipped in pmo/ (sorted)."""
    return sorted(f[:-5] for f in os.listdir(PMO_DIR) if f.endswith('.toml'))


def task_path(task):
    """The TOML file of `pmo/NAME` (or NAME): ConfigError if there is none."""
    name = task[4:] if task.startswith('pmo/') else task
    path = os.path.join(PMO_DIR, name + '.toml')
    if not _NAME.fullmatch(name) or not os.path.isfile(path):
        raise ConfigError('no task %r; the PMO tasks are: %s' % (task, ', '.join(pmo_tasks())))
    return path


def _quiet_rdkit():
    from rdkit import RDLogger
    RDLogger.DisableLog('rdApp.*')


def _mol(smiles):
    """RDKit molecule of a SMILES, or None (does not parse, or no atoms)."""
    from rdkit import Chem
    if not smiles:
        return None
    m = Chem.MolFromSmiles(smiles)
    return m if m is not None and m.GetNumAtoms() > 0 else None


class _Entry:
    def __init__(self, name, comp, mods, weight):
        self.name, self.comp, self.mods, self.weight = name, comp, mods, weight


class Scorer:
    """A parsed configuration. Build with load(), from_toml() or Scorer(dict)."""

    TOP_KEYS = ('name', 'description', 'aggregate', 'component')
    ENTRY_KEYS = ('kind', 'name', 'weight', 'modifier')

    def __init__(self, cfg, where='config'):
        _quiet_rdkit()
        if not isinstance(cfg, dict):
            raise ConfigError('%s: not a table' % where)
        for k in cfg:
            if k not in self.TOP_KEYS:
                raise ConfigError('%s: unknown key %r (the keys are: %s)'
                                  % (where, k, ', '.join(self.TOP_KEYS)))
        self.name = cfg.get('name', os.path.splitext(os.path.basename(where))[0])
        self.aggregate = cfg.get('aggregate', 'geometric')
        if self.aggregate not in ('geometric', 'arithmetic'):
            raise ConfigError('%s: aggregate %r is not "geometric" or "arithmetic"'
                              % (where, self.aggregate))
        comps = cfg.get('component')
        if not isinstance(comps, list) or not comps:
            raise ConfigError('%s: no [[component]] table' % where)
        self.entries = []
        seen = {}
        for i, c in enumerate(comps):
            at = '%s: component %d' % (where, i + 1)
            if not isinstance(c, dict):
                raise ConfigError('%s: not a table' % at)
            kind = c.get('kind')
            if kind not in COMPONENTS:
                raise ConfigError('%s: kind %r is not one of: %s'
                                  % (at, kind, ', '.join(sorted(COMPONENTS))))
            at = '%s (%s)' % (at, kind)
            opts = {k: v for k, v in c.items() if k not in self.ENTRY_KEYS}
            comp = COMPONENTS[kind](opts, at)
            seen[kind] = seen.get(kind, 0) + 1
            name = c.get('name', kind if seen[kind] == 1 else '%s_%d' % (kind, seen[kind]))
            if not isinstance(name, str) or not _NAME.fullmatch(name) or name.endswith('_raw'):
                raise ConfigError('%s: name %r: use letters, digits, _ . - (not ending in _raw)'
                                  % (at, name))
            if any(e.name == name for e in self.entries):
                raise ConfigError('%s: name %r is used twice' % (at, name))
            w = c.get('weight', 1.0)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < math.inf):
                raise ConfigError('%s: weight must be a number > 0, not %r' % (at, w))
            mods = c.get('modifier', [])
            mods = [mods] if isinstance(mods, dict) else mods
            if not isinstance(mods, list):
                raise ConfigError('%s: modifier must be a table or a list of tables' % at)
            mods = [self._modifier(comp, m, at) for m in mods]
            if not mods and not comp.unit:
                raise ConfigError('%s: the raw value of %r is not a score in [0, 1]: give it a '
                                  'modifier (e.g. modifier = {kind = "gaussian", mu = ..., '
                                  'sigma = ...})' % (at, kind))
            self.entries.append(_Entry(name, comp, mods, float(w)))
        # the weights normalised to sum 1, without overflow or underflow:
        # divided by the largest first (each in (0, 1], their sum in
        # [1, n]), so 1e308 + 1e308 (inf) or 5e-324 / sum are never formed
        top = max(e.weight for e in self.entries)
        rel = [e.weight / top for e in self.entries]
        total = sum(rel)
        self.norm_weights = [r / total for r in rel]

    @staticmethod
    def _modifier(comp, table, where):
        if not isinstance(table, dict):
            return make_modifier(table, where)
        t = {}
        for k, v in table.items():
            if k.endswith('_of') and isinstance(v, str):
                m = _mol(v)
                if m is None:
                    raise ConfigError('%s: %s %r is not a SMILES that RDKit parses' % (where, k, v))
                t[k[:-3]] = comp.raw(m)
            else:
                t[k] = v
        return make_modifier(t, where)

    def components(self, mol):
        """[(name, score, raw)] of an RDKit molecule (raw None without a modifier)."""
        out = []
        for e in self.entries:
            x = float(e.comp.raw(mol))
            s = x
            for m in e.mods:
                s = m(s)
            if not math.isfinite(s):
                raise ValueError('component %s gave %r' % (e.name, s))
            out.append((e.name, min(max(s, 0.0), 1.0), x if e.mods else None))
        return out

    def combine(self, scores):
        ws = self.norm_weights  # sum 1: the weighted mean needs no division
        if self.aggregate == 'arithmetic':
            return min(max(sum(w * s for w, s in zip(ws, scores)), 0.0), 1.0)
        if min(scores) <= 0.0:
            return 0.0
        return min(max(math.exp(sum(w * math.log(s) for w, s in zip(ws, scores))), 0.0), 1.0)

    def score(self, smiles):
        """Result of one SMILES; score nan when it does not parse."""
        from rdkit import Chem
        m = _mol(smiles)
        if m is None:
            return Result(math.nan, None, [])
        comps = self.components(m)
        fields = []
        for name, s, raw in comps:
            fields.append((name, s))
            if raw is not None:
                fields.append((name + '_raw', raw))
        return Result(self.combine([s for _, s, _ in comps]), Chem.MolToSmiles(m), fields,
                      murcko_scaffold(m))

    def __call__(self, smiles):
        return self.score(smiles).score


def from_toml(text, where='config'):
    """Scorer from TOML text."""
    import tomllib
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError('%s: not valid TOML: %s' % (where, e))
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError('%s: nested too deeply to be a scoring configuration' % where)
    return Scorer(cfg, where)


MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few hundred bytes


def _read_config(path):
    """The bytes of a configuration file: a regular file (not a FIFO, which
    would block, nor a device such as /dev/zero, which never ends) of at
    most MAX_CONFIG_BYTES."""
    import stat
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0))
    except OSError as e:
        raise ConfigError('%s: cannot read: %s' % (path, e.strerror or e))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError('%s: not a regular file' % path)
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError('%s: %d bytes, more than a configuration can be (%d)'
                              % (path, st.st_size, MAX_CONFIG_BYTES))
        chunks, n = [], 0
        while n <= MAX_CONFIG_BYTES:  # bounded even if the file grows meanwhile
            b = os.read(fd, MAX_CONFIG_BYTES + 1 - n)
            if not b:
                break
            chunks.append(b)
            n += len(b)
        if n > MAX_CONFIG_BYTES:
            raise ConfigError('%s: more than %d bytes' % (path, MAX_CONFIG_BYTES))
        return b''.join(chunks)
    except OSError as e:
        raise ConfigError('%s: cannot read: %s' % (path, e.strerror or e))
    finally:
        os.close(fd)


def load(config):
    """Scorer from a TOML path, 'pmo/NAME' (the shipped task, whatever the
    working directory holds), or a Scorer (returned as is)."""
    if isinstance(config, Scorer):
        return config
    if isinstance(config, dict):
        return Scorer(config)
    path = config
    if config.startswith('pmo/') and not config.endswith('.toml'):
        # a shipped task, always: never ./pmo/NAME of the working directory
        path = task_path(config)
    data = _read_config(path)
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError:
        raise ConfigError('%s: not UTF-8 text' % path)
    return from_toml(text, path)


def score_smiles(config, smiles):
    """Scores (floats in [0, 1], nan for a molecule that cannot be scored)
    of a list of SMILES under `config` (see load())."""
    sc = load(config)
    out = []
    for s in smiles:
        try:
            out.append(sc.score(s).score)
        except Exception:
            out.append(math.nan)
    return out


def randomized(smiles, n, seed):
    """n randomized SMILES of a molecule (RDKit MolToRandomSmilesVect, the
    random atom orders of MolToSmiles(doRandom=True), seeded from `seed` so
    the same (smiles, n, seed) gives the same list in every run), or None if
    the SMILES does not parse or RDKit cannot write it (MolToSmiles raises a
    pre-condition violation on some molecules it parses)."""
    from rdkit import Chem
    m = _mol(smiles)
    if m is None:
        return None
    try:
        # RDKit seeds only with a positive value (0 means unseeded)
        return list(Chem.MolToRandomSmilesVect(m, n, randomSeed=seed % 2147483647 + 1))
    except Exception:
        return None


def format_number(x):
    """A float as a plain decimal (no exponent: strtod and humans read it)."""
    if math.isnan(x):
        return 'nan'
    s = repr(float(x))
    if 'e' in s or 'E' in s:
        s = ('%.20f' % x).rstrip('0')
        s = s + '0' if s.endswith('.') else s
    return s


def format_result(r):
    """The protocol line of a Result (without the newline)."""
    if math.isnan(r.score):
        return 'nan'
    fields = [format_number(r.score)]
    if r.canonical is not None:
        fields.append('canonical=' + r.canonical)
    if r.scaffold is not None:
        fields.append('scaffold=' + r.scaffold)
    fields += ['%s=%s' % (n, format_number(v)) for n, v in r.components]
    return '\t'.join(fields)
