"""Interoperability of molgen's safetensors writer / reader with an
independent pure-numpy implementation of the format (the `safetensors`
package is not available here).

Uses the C test binary molgen_test_safetensors (hooks MOLGEN_ST_EXPORT /
MOLGEN_ST_IMPORT); it is looked up in $MOLGEN_TEST_BIN_DIR, then in the
build*/molgen/ directories of the repository (newest first). Skipped if none
is built."""
import glob
import json
import math
import os
import struct
import subprocess
import tempfile
import zlib

import pytest

np = pytest.importorskip('numpy')

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, '..', '..', '..'))
NAME = 'molgen_test_safetensors'


def _candidates():
    cands = []
    d = os.environ.get('MOLGEN_TEST_BIN_DIR')
    if d:
        cands.append(os.path.join(d, NAME))
    lib = os.environ.get('ATTN_LIBRARY')  # set by `make test-python`
    if lib:
        cands.append(os.path.join(os.path.dirname(lib), 'molgen', NAME))
    found = glob.glob(os.path.join(ROOT, 'build*', 'molgen', NAME))
    cands += sorted(found, key=os.path.getmtime, reverse=True)
    return [c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)]


def _binary():
    """The first built test binary that has the interop hooks (a stale build
    without them is passed over)."""
    with tempfile.TemporaryDirectory() as d:
        probe = os.path.join(d, 'probe.safetensors')
        for c in _candidates():
            p = subprocess.run([c], capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, MOLGEN_ST_EXPORT=probe))
            if 'interop: wrote' in p.stdout:
                return c
    pytest.skip('no molgen_test_safetensors with interop hooks built '
                '(build with cmake first, or set MOLGEN_TEST_BIN_DIR)')


# Formula values, as in test_safetensors.c
def f32_vals(n):
    return np.array([np.float32(math.sin(0.1 * i)) * np.float32(3.0) + np.float32(i)
                     for i in range(n)], dtype=np.float32)


def i64_vals(n):
    return np.array([i * i * 1000003 - 7 for i in range(n)], dtype=np.int64)


def f64_vals(n):
    return np.array([1.0 / (i + 1) for i in range(n)], dtype=np.float64)


def u8_vals(n):
    return np.array([(i * 37 + 1) & 0xFF for i in range(n)], dtype=np.uint8)


DT = {'F32': np.float32, 'F64': np.float64, 'I64': np.int64, 'U8': np.uint8,
      'I32': np.int32}
VOCAB = '["<pad>","C\\\\"]'


def read_safetensors(path):
    """Minimal spec reader: returns (tensors dict, metadata dict, header)."""
    raw = open(path, 'rb').read()
    assert len(raw) >= 8
    (n,) = struct.unpack('<Q', raw[:8])
    assert 8 + n <= len(raw)
    text = raw[8:8 + n].decode('utf-8')
    assert text.startswith('{')
    hdr = json.loads(text)
    meta = hdr.pop('__metadata__', {})
    buf = raw[8 + n:]
    spans = []
    out = {}
    for name, info in hdr.items():
        b, e = info['data_offsets']
        dt = np.dtype(DT[info['dtype']]).newbyteorder('<')
        shape = tuple(info['shape'])
        assert e - b == int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        out[name] = np.frombuffer(buf[b:e], dtype=dt).reshape(shape)
        spans.append((b, e))
    spans.sort()
    pos = 0
    for b, e in spans:  # no holes, no overlaps, whole buffer covered
        assert b == pos
        pos = e
    assert pos == len(buf)
    return out, meta, (n, text)


def write_safetensors(path, tensors, metadata):
    """Independent writer: tensors in the given order, __metadata__ last,
    pretty-ish JSON with spaces, padded to 8 with spaces."""
    hdr = {}
    blobs = []
    off = 0
    for name, arr in tensors:
        a = np.ascontiguousarray(arr)
        dtname = {np.dtype(v): k for k, v in DT.items()}[a.dtype]
        data = a.astype(a.dtype.newbyteorder('<')).tobytes()
        hdr[name] = {'shape': list(a.shape), 'dtype': dtname,
                     'data_offsets': [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    hdr['__metadata__'] = metadata
    text = json.dumps(hdr, indent=1).encode('utf-8')
    text += b' ' * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def test_c_writer_read_by_numpy(tmp_path):
    binary = _binary()
    path = str(tmp_path / 'from_c.safetensors')
    env = dict(os.environ, MOLGEN_ST_EXPORT=path)
    p = subprocess.run([binary], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    t, meta, (n, text) = read_safetensors(path)
    assert (8 + n) % 8 == 0
    assert set(t) == {'u8', 'f32', 'i64', 'f64'}
    np.testing.assert_array_equal(t['i64'], i64_vals(4))
    np.testing.assert_array_equal(t['u8'], u8_vals(5))
    np.testing.assert_allclose(t['f32'], f32_vals(6).reshape(2, 3), rtol=1e-7)
    np.testing.assert_allclose(t['f64'], f64_vals(3), rtol=1e-15)
    assert t['f32'].shape == (2, 3)
    # the checksum table: every tensor's CRC-32, checked with Python's zlib
    crcs = json.loads(meta.pop('crc32'))
    assert set(crcs) == set(t)
    for name, arr in t.items():
        assert int(crcs[name], 16) == zlib.crc32(arr.tobytes()), name
    assert meta == {'format': 'pt', 'vocab': VOCAB}
    assert json.loads(meta['vocab']) == ['<pad>', 'C\\']


def test_numpy_writer_read_by_c(tmp_path):
    binary = _binary()
    path = str(tmp_path / 'from_py.safetensors')
    # deliberately not the C writer's layout: 1-byte tensor first (so later
    # tensors are unaligned in the file), other key order
    write_safetensors(path, [('u8', u8_vals(5)), ('f32', f32_vals(6).reshape(2, 3)),
                             ('i64', i64_vals(4)), ('f64', f64_vals(3))],
                      {'vocab': VOCAB, 'format': 'pt'})
    read_safetensors(path)  # our own writer is valid for our own reader
    env = dict(os.environ, MOLGEN_ST_IMPORT=path)
    p = subprocess.run([binary], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'interop: read' in p.stdout
    assert '(checksummed 0)' in p.stdout  # a file without checksums still loads


INTEROP = [('u8', u8_vals(5)), ('f32', f32_vals(6).reshape(2, 3)),
           ('i64', i64_vals(4)), ('f64', f64_vals(3))]


def _crc_table(tensors):
    return json.dumps({n: '%08x' % zlib.crc32(np.ascontiguousarray(a).tobytes())
                       for n, a in tensors})


def test_checksums_from_python_verified_by_c(tmp_path):
    binary = _binary()
    path = str(tmp_path / 'crc.safetensors')
    write_safetensors(path, INTEROP, {'vocab': VOCAB, 'format': 'pt',
                                      'crc32': _crc_table(INTEROP)})
    env = dict(os.environ, MOLGEN_ST_IMPORT=path)
    p = subprocess.run([binary], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '(checksummed 1)' in p.stdout


def test_flipped_data_byte_is_refused(tmp_path):
    binary = _binary()
    path = str(tmp_path / 'flip.safetensors')
    write_safetensors(path, INTEROP, {'vocab': VOCAB, 'format': 'pt',
                                      'crc32': _crc_table(INTEROP)})
    raw = bytearray(open(path, 'rb').read())
    (n,) = struct.unpack('<Q', raw[:8])
    # u8 is the first tensor in the buffer: flip one bit of its third byte
    raw[8 + n + 2] ^= 0x10
    open(path, 'wb').write(bytes(raw))
    env = dict(os.environ, MOLGEN_ST_IMPORT=path)
    p = subprocess.run([binary], capture_output=True, text=True, env=env, timeout=120)
    assert "tensor 'u8' fails its checksum" in p.stdout, p.stdout + p.stderr
