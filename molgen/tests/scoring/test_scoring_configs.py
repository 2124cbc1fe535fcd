"""molgen.scoring configurations at the edges of what parses (extreme
weights and modifier parameters, featureless similarity targets), against
independent oracles: RDKit's own QED and descriptors,
exact rational arithmetic (fractions) for weighted means, mpmath at 60
digits for the modifiers at float64's extremes. Also what a configuration
may be: a regular file of bounded size (not /dev/zero, not a FIFO), TOML
nested 100,000 deep is exit 2 with one line, --check scores probe molecules
and refuses a similarity target without fingerprint features, and
--task pmo/NAME is always the shipped task. Run with /usr/bin/python3."""
import math
import os
import subprocess
import sys
from fractions import Fraction

import pytest

pytest.importorskip('rdkit')
mpmath = pytest.importorskip('mpmath')
from rdkit import Chem  # noqa: E402
from rdkit.Chem import QED, Crippen  # noqa: E402

import molgen.scoring as S  # noqa: E402
from molgen.scoring import modifiers as MOD  # noqa: E402
from molgen.scoring import __main__ as SERVER  # noqa: E402

PY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(S.__file__))))
ENV = dict(os.environ, PYTHONPATH=PY)
MOLS = ['CC(=O)Nc1ccc(O)cc1', 'c1ccc2ccccc2c1', 'CCO', 'C']


def _serve(args, stdin='', timeout=60, cwd=None):
    return subprocess.run([sys.executable, '-m', 'molgen.scoring'] + args, input=stdin,
                          capture_output=True, text=True, env=ENV, timeout=timeout, cwd=cwd)


def _one_line_exit_2(p, says):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and p.stdout == '', (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith('molgen.scoring: ') and says in lines[0], \
        p.stderr[-2000:]


def _cfg(tmp_path, text, name='c.toml'):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# --------------------------------------------------------------- weights

@pytest.mark.parametrize('agg', ['arithmetic', 'geometric'])
@pytest.mark.parametrize('w1, w2', [(1e308, 1e308), (5e-324, 5e-324), (1e308, 1.0),
                                    (5e-324, 1.0), (1.7976931348623157e308, 5e-324)])
def test_extreme_weights_are_a_weighted_mean(agg, w1, w2):
    """qed and a clipped logP with weights near float64's ends: the score is
    the weighted mean of the two component scores (exact fractions for the
    arithmetic mean; mpmath for the geometric), never 0, nan, or 1.0 (two
    1e308 weights sum to inf in float64)."""
    sc = S.Scorer({'aggregate': agg, 'component': [
        {'kind': 'qed', 'weight': w1},
        {'kind': 'logp', 'weight': w2, 'modifier': {'kind': 'clipped', 'upper_x': 5.0}}]})
    for smi in MOLS[:3]:
        m = Chem.MolFromSmiles(smi)
        a = QED.qed(m)
        b = min(max(Crippen.MolLogP(m) / 5.0, 0.0), 1.0)
        got = sc.score(smi).score
        if agg == 'arithmetic':
            want = float((Fraction(w1) * Fraction(a) + Fraction(w2) * Fraction(b))
                         / (Fraction(w1) + Fraction(w2)))
        elif min(a, b) <= 0:
            want = 0.0
        else:
            with mpmath.workdps(60):
                W1, W2 = mpmath.mpf(w1), mpmath.mpf(w2)
                want = float(mpmath.exp((W1 * mpmath.log(a) + W2 * mpmath.log(b)) / (W1 + W2)))
        assert math.isfinite(got) and abs(got - want) <= 4e-16, (smi, got, want)


# ------------------------------------------------------------- modifiers

def _oracle(kind, p, x):
    """The modifier's formula (modifiers.py's docstring) in mpmath, 60 digits."""
    with mpmath.workdps(60):
        x = mpmath.mpf(x)
        q = {k: mpmath.mpf(v) for k, v in p.items()}
        s10 = lambda z: 1 / (1 + mpmath.power(10, -z))  # noqa: E731
        if kind in ('gaussian', 'min_gaussian', 'max_gaussian'):
            if kind == 'min_gaussian':
                x = max(x, q['mu'])
            if kind == 'max_gaussian':
                x = min(x, q['mu'])
            y = mpmath.exp(-((x - q['mu']) / q['sigma']) ** 2 / 2)
        elif kind == 'clipped':
            lo, ls, hs = q.get('lower_x', 0), q.get('low_score', 0), q.get('high_score', 1)
            y = hs + (hs - ls) / (q['upper_x'] - lo) * (x - q['upper_x'])
            y = min(max(y, ls), hs)
        elif kind == 'threshold':
            y = min(x, q['threshold']) / q['threshold']
        elif kind in ('sigmoid', 'reverse_sigmoid'):
            z = 10 * q['k'] * (x - (q['low'] + q['high']) / 2) / (q['high'] - q['low'])
            y = s10(z if kind == 'sigmoid' else -z)
        elif kind == 'double_sigmoid':
            div, si, se = q.get('coef_div', 100), q.get('coef_si', 150), q.get('coef_se', 150)
            y = s10(se * (x - q['low']) / div) - s10(si * (x - q['high']) / div)
        return float(min(max(y, 0), 1))


BIG, TINY = 1e308, 5e-324
EXTREMES = [
    ('gaussian', {'mu': 2.5, 'sigma': 1e-200}),
    ('gaussian', {'mu': -BIG, 'sigma': 1e-300}),
    ('gaussian', {'mu': 0, 'sigma': BIG}),
    ('gaussian', {'mu': BIG, 'sigma': 1.0}),
    ('min_gaussian', {'mu': 1.0, 'sigma': TINY}),
    ('max_gaussian', {'mu': -BIG, 'sigma': 1e-10}),
    ('clipped', {'upper_x': TINY}),
    ('clipped', {'upper_x': BIG, 'lower_x': -BIG}),
    ('clipped', {'upper_x': -BIG, 'lower_x': BIG, 'low_score': 0.25}),
    ('threshold', {'threshold': TINY}),
    ('threshold', {'threshold': BIG}),
    ('sigmoid', {'low': -BIG, 'high': BIG, 'k': 0.5}),
    ('sigmoid', {'low': 0, 'high': TINY, 'k': BIG}),
    ('reverse_sigmoid', {'low': 1, 'high': 2, 'k': BIG}),
    ('double_sigmoid', {'low': -BIG, 'high': BIG}),
    ('double_sigmoid', {'low': 1, 'high': 3, 'coef_div': 1e-300}),
    ('double_sigmoid', {'low': 1, 'high': 3, 'coef_div': BIG, 'coef_si': BIG, 'coef_se': BIG}),
]
XS = [-BIG, -1e10, -1.0, 0.0, TINY, 1.0, 1.5, 2.5, 3.0, 1e10, BIG]


@pytest.mark.parametrize('kind, params', EXTREMES)
def test_modifiers_at_float64_extremes(kind, params):
    """Every modifier with parameters near float64's ends, at raw values from
    -1e308 to 1e308: a number in [0, 1] that matches the formula evaluated
    in 60-digit mpmath (never OverflowError, inf or nan: a Gaussian with
    sigma 1e-200 overflows a float64 formula on every molecule)."""
    m = MOD.make_modifier(dict(params, kind=kind), 'test')
    for x in XS:
        got = min(max(m(x), 0.0), 1.0)  # as Scorer.components clips
        want = _oracle(kind, params, x)
        assert math.isfinite(got) and abs(got - want) <= 1e-12, (x, got, want)


def test_server_scores_with_a_tiny_sigma(tmp_path):
    """The server on a Gaussian of logP with sigma 1e-200: each molecule
    scored (0 here: no logP equals mu to 1e-200), no 'cannot score' line."""
    cfg = _cfg(tmp_path, '[[component]]\nkind = "logp"\n'
               'modifier = {kind = "gaussian", mu = 2.5, sigma = 1e-200}\n')
    p = _serve([cfg], '\n'.join(MOLS) + '\n')
    assert p.returncode == 0 and p.stderr == '', p.stderr
    replies = p.stdout.splitlines()
    assert len(replies) == len(MOLS)
    for smi, line in zip(MOLS, replies):
        want = _oracle('gaussian', {'mu': 2.5, 'sigma': 1e-200},
                       Crippen.MolLogP(Chem.MolFromSmiles(smi)))
        assert float(line.split('\t')[0]) == want, (smi, line)
    assert _serve(['--check', cfg]).returncode == 0


# ----------------------------------------------------------------- --check

def test_empty_target_fingerprint_refused(tmp_path):
    """Benzene has no PHCO (Gobbi 2D pharmacophore) feature: its Tanimoto with
    another featureless molecule is 0/0, which RDKit calls 1.0 (methane
    would score 1.0). Refused when the configuration is loaded, so
    --check and the server both exit 2 with one line."""
    cfg = _cfg(tmp_path, '[[component]]\nkind = "similarity"\ntarget = "c1ccccc1"\n'
               'fingerprint = "PHCO"\n')
    for args in (['--check', cfg], [cfg]):
        _one_line_exit_2(_serve(args, 'C\n'), 'empty PHCO fingerprint')
    # a target with features: methane (no feature) scores 0, not 1
    sc = S.Scorer({'component': [{'kind': 'similarity', 'target': 'CC(=O)Nc1ccc(O)cc1',
                                  'fingerprint': 'PHCO'}]})
    assert sc.score('C').score == 0.0


def test_check_scores_probe_molecules():
    """--check runs the configuration on probe molecules: a component that
    fails on them (as the tiny-sigma Gaussian did on every molecule) is a
    ConfigError naming the molecule, not a silent 'ok'."""
    sc = S.Scorer({'component': [{'kind': 'qed'}]})
    SERVER.probe(sc)  # a sound configuration passes

    def boom(x):
        raise OverflowError('(34, \'Numerical result out of range\')')
    sc.entries[0].mods = [boom]
    with pytest.raises(S.ConfigError, match='probe molecule .* OverflowError'):
        SERVER.probe(sc)


# ----------------------------------------------------- what a config may be

def test_deeply_nested_toml_is_exit_2_one_line(tmp_path):
    """100,000 nested arrays: tomllib recurses (RecursionError, a traceback
    and exit 1 if let through); exit 2 and one line, as every bad configuration."""
    cfg = _cfg(tmp_path, 'x = ' + '[' * 100000 + ']' * 100000 + '\n')
    _one_line_exit_2(_serve([cfg]), 'nested too deeply')
    _one_line_exit_2(_serve(['--check', cfg]), 'nested too deeply')


def test_fifo_config_refused_without_waiting(tmp_path):
    """A FIFO (nobody writing) would block the open forever."""
    fifo = str(tmp_path / 'c.toml')
    os.mkfifo(fifo)
    _one_line_exit_2(_serve([fifo], timeout=30), 'not a regular file')


def test_device_and_huge_configs_refused(tmp_path):
    """/dev/zero was read until MemoryError; a regular file over 1 MiB is no
    configuration either (refused by its size, before reading)."""
    _one_line_exit_2(_serve(['/dev/zero'], timeout=30), 'not a regular file')
    big = tmp_path / 'big.toml'
    big.write_text('# ' + 'x' * (2 << 20) + '\n[[component]]\nkind = "qed"\n')
    _one_line_exit_2(_serve([str(big)], timeout=30), 'more than a configuration can be')


def test_task_is_always_the_shipped_one(tmp_path):
    """--task pmo/qed (and load('pmo/qed')) is the shipped QED task even when
    the working directory holds its own pmo/qed: RDKit's QED, not the
    planted configuration's constant."""
    (tmp_path / 'pmo').mkdir()
    planted = '[[component]]\nkind = "smarts"\npattern = "[#6]"\n'  # 1 for any carbon
    (tmp_path / 'pmo' / 'qed').write_text(planted)
    (tmp_path / 'pmo' / 'qed.toml').write_text(planted)
    p = _serve(['--task', 'pmo/qed'], '\n'.join(MOLS[:3]) + '\n', cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    for smi, line in zip(MOLS[:3], p.stdout.splitlines()):
        want = QED.qed(Chem.MolFromSmiles(smi))
        assert abs(float(line.split('\t')[0]) - want) <= 1e-9, (smi, line, want)
    here = os.getcwd()
    try:
        os.chdir(str(tmp_path))
        assert S.load('pmo/qed').score('CCO').score == pytest.approx(
            QED.qed(Chem.MolFromSmiles('CCO')), abs=1e-9)
    finally:
        os.chdir(here)
