"""Score modifiers: maps from a component's raw value x to a score in [0, 1].

GuacaMol's (Brown et al. 2019, guacamol/score_modifier.py semantics):
  gaussian      exp(-((x - mu) / sigma)^2 / 2)
  min_gaussian  1 for x <= mu, else the gaussian (smaller is better)
  max_gaussian  1 for x >= mu, else the gaussian (larger is better)
  clipped       the line through (lower_x, low_score) and (upper_x, high_score),
                clipped to [low_score, high_score] (upper_x < lower_x makes
                it decreasing); defaults lower_x = 0, low_score = 0,
                high_score = 1 (GuacaMol's ClippedScoreModifier)
  threshold     min(x, threshold) / threshold (ThresholdedLinearModifier)
REINVENT 4's transforms (base-10 logistic curves):
  sigmoid         1 / (1 + 10^(10 k (mid - x) / (high - low))), mid = (low + high) / 2
  reverse_sigmoid 1 - sigmoid (the same curve mirrored: high x scores low)
  double_sigmoid  s(coef_se (x - low) / coef_div) - s(coef_si (x - high) / coef_div)
                  with s(z) = 1 / (1 + 10^-z): ~1 inside [low, high], ~0 outside;
                  defaults coef_div = 100, coef_si = coef_se = 150
  step            1 if low <= x <= high else 0
Each is a class built from the TOML table's keys (kind = NAME and the
parameters above); a wrong or missing key is a ConfigError naming it.
"""

import math


class ConfigError(Exception):
    """A scoring configuration that cannot be used (message names the key)."""


def _pow10_logistic(z):
    """1 / (1 + 10^-z) without overflow for large |z| (±inf: 1 or 0)."""
    t = z * math.log(10.0)
    if t != t:
        return t
    if t > 800.0:
        return 1.0
    if t < -800.0:
        return 0.0
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


def _ratio(a, b, c, d):
    """(a - b) / (c - d), c != d, near float64's range: a difference that
    overflows (1e308 - -1e308) is taken in halves, which is exact, when
    the denominator's does; a ratio beyond float64 is ±inf (clipped by the
    caller). c - d of two different floats is never 0 (gradual underflow)."""
    num, den = a - b, c - d
    if math.isinf(den):
        num, den = 0.5 * a - 0.5 * b, 0.5 * c - 0.5 * d
    return num / den


def _scaled(coef, a, b, div):
    """coef * (a - b) / div, with 0 * inf and intermediate overflow or
    underflow avoided: the plain product when it is a finite nonzero number,
    else through logarithms (±inf beyond float64)."""
    d = a - b
    if coef == 0 or d == 0:
        return 0.0
    v = coef * d / div
    if math.isfinite(v) and math.isfinite(d) and v != 0:
        return v
    ld = math.log(abs(d)) if math.isfinite(d) else math.log(abs(0.5 * a - 0.5 * b)) + math.log(2.0)
    L = math.log(abs(coef)) + ld - math.log(abs(div))
    sign = math.copysign(1.0, coef) * math.copysign(1.0, d) * math.copysign(1.0, div)
    return sign * (math.inf if L > 709.0 else math.exp(L))


class Modifier:
    kind = None
    required = ()
    optional = {}

    def __init__(self, params, where):
        known = set(self.required) | set(self.optional)
        for k in params:
            if k not in known:
                raise ConfigError('%s: modifier %r has no parameter %r (it takes: %s)'
                                  % (where, self.kind, k, ', '.join(sorted(known)) or 'none'))
        self.p = dict(self.optional)
        for k in self.required:
            if k not in params:
                raise ConfigError('%s: modifier %r needs %r' % (where, self.kind, k))
        for k, v in params.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError('%s: modifier %r: %s must be a finite number, not %r'
                                  % (where, self.kind, k, v))
            self.p[k] = float(v)
        self.check(where)

    def check(self, where):
        pass

    def __call__(self, x):
        raise NotImplementedError


class Gaussian(Modifier):
    kind = 'gaussian'
    required = ('mu', 'sigma')

    def check(self, where):
        if self.p['sigma'] <= 0:
            raise ConfigError('%s: modifier %r: sigma must be > 0' % (where, self.kind))

    def __call__(self, x):
        # |x - mu| / sigma, then the square: a tiny sigma (1e-200) or a far x
        # overflows the square (OverflowError), and exp(-z^2/2) is 0 in
        # float64 for z > 39 anyway; an x - mu beyond float64 is inf here
        z = abs(x - self.p['mu']) / self.p['sigma']
        if z > 40.0:
            return 0.0
        return math.exp(-0.5 * z * z)


class MinGaussian(Gaussian):
    kind = 'min_gaussian'

    def __call__(self, x):
        return Gaussian.__call__(self, max(x, self.p['mu']))


class MaxGaussian(Gaussian):
    kind = 'max_gaussian'

    def __call__(self, x):
        return Gaussian.__call__(self, min(x, self.p['mu']))


class Clipped(Modifier):
    kind = 'clipped'
    required = ('upper_x',)
    optional = {'lower_x': 0.0, 'high_score': 1.0, 'low_score': 0.0}

    def check(self, where):
        p = self.p
        if p['upper_x'] == p['lower_x']:
            raise ConfigError('%s: modifier %r: upper_x and lower_x must differ' % (where, self.kind))
        if not 0.0 <= p['low_score'] < p['high_score'] <= 1.0:
            raise ConfigError('%s: modifier %r: need 0 <= low_score < high_score <= 1'
                              % (where, self.kind))

    def __call__(self, x):
        p = self.p
        # the fraction of the way from lower_x to upper_x, clipped to [0, 1]
        # (the differences can overflow near float64's range: _ratio)
        t = _ratio(x, p['lower_x'], p['upper_x'], p['lower_x'])
        t = min(max(t, 0.0), 1.0) if t == t else t
        return p['low_score'] + t * (p['high_score'] - p['low_score'])


class Threshold(Modifier):
    kind = 'threshold'
    required = ('threshold',)

    def check(self, where):
        if self.p['threshold'] <= 0:
            raise ConfigError('%s: modifier %r: threshold must be > 0' % (where, self.kind))

    def __call__(self, x):
        return min(x, self.p['threshold']) / self.p['threshold']


class Sigmoid(Modifier):
    kind = 'sigmoid'
    required = ('low', 'high', 'k')

    def check(self, where):
        if self.p['high'] <= self.p['low']:
            raise ConfigError('%s: modifier %r: need low < high' % (where, self.kind))

    def _z(self, x):
        p = self.p
        # mid as halves (low + high overflows near float64's range); the
        # ratio through _ratio; a z beyond float64 is ±inf, which the
        # logistic takes (a step); k 0 is flat (never 0 * inf)
        if max(abs(p['low']), abs(p['high'])) < 1e-300:
            # halving a subnormal low or high drops bits (mid of 0 and
            # 5e-324 would be 0): the fraction of the way, less 1/2
            u = _ratio(x, p['low'], p['high'], p['low']) - 0.5
        else:
            mid = 0.5 * p['low'] + 0.5 * p['high']
            u = _ratio(x, mid, p['high'], p['low'])  # (x - mid) / (high - low)
        if p['k'] == 0 or u == 0:
            return 0.0
        return 10.0 * p['k'] * u

    def __call__(self, x):
        return _pow10_logistic(self._z(x))


class ReverseSigmoid(Sigmoid):
    kind = 'reverse_sigmoid'

    def __call__(self, x):
        return _pow10_logistic(-self._z(x))


class DoubleSigmoid(Modifier):
    kind = 'double_sigmoid'
    required = ('low', 'high')
    optional = {'coef_div': 100.0, 'coef_si': 150.0, 'coef_se': 150.0}

    def check(self, where):
        if self.p['high'] <= self.p['low']:
            raise ConfigError('%s: modifier %r: need low < high' % (where, self.kind))
        if self.p['coef_div'] == 0:
            raise ConfigError('%s: modifier %r: coef_div must not be 0' % (where, self.kind))

    def __call__(self, x):
        p = self.p
        return (_pow10_logistic(_scaled(p['coef_se'], x, p['low'], p['coef_div']))
                - _pow10_logistic(_scaled(p['coef_si'], x, p['high'], p['coef_div'])))


class Step(Modifier):
    kind = 'step'
    required = ('low', 'high')

    def check(self, where):
        if self.p['high'] < self.p['low']:
            raise ConfigError('%s: modifier %r: need low <= high' % (where, self.kind))

    def __call__(self, x):
        return 1.0 if self.p['low'] <= x <= self.p['high'] else 0.0


MODIFIERS = {c.kind: c for c in (Gaussian, MinGaussian, MaxGaussian, Clipped, Threshold,
                                 Sigmoid, ReverseSigmoid, DoubleSigmoid, Step)}


def make_modifier(table, where):
    """A Modifier from a TOML table {kind = NAME, parameters...}."""
    if not isinstance(table, dict):
        raise ConfigError('%s: a modifier is a table like {kind = "gaussian", mu = 0, sigma = 1}'
                          % where)
    params = dict(table)
    kind = params.pop('kind', None)
    if kind not in MODIFIERS:
        raise ConfigError('%s: modifier kind %r is not one of: %s'
                          % (where, kind, ', '.join(sorted(MODIFIERS))))
    return MODIFIERS[kind](params, where)
