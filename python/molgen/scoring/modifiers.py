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
    """1 / (1 + 10^-z) without overflow for large |z|."""
    t = z * math.log(10.0)
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


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
        return math.exp(-0.5 * ((x - self.p['mu']) / self.p['sigma']) ** 2)


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
        slope = (p['high_score'] - p['low_score']) / (p['upper_x'] - p['lower_x'])
        y = p['high_score'] + slope * (x - p['upper_x'])
        return min(max(y, p['low_score']), p['high_score'])


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
        return 10.0 * p['k'] * (x - 0.5 * (p['low'] + p['high'])) / (p['high'] - p['low'])

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
        return (_pow10_logistic(p['coef_se'] * (x - p['low']) / p['coef_div'])
                - _pow10_logistic(p['coef_si'] * (x - p['high']) / p['coef_div']))


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
