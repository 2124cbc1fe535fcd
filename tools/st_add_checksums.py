#!/usr/bin/env python3
"""Add the CRC-32 checksum table to a safetensors file written before molgen
stored one (molgen/base/safetensors.h, "Integrity"): the tensors' bytes are kept
as they are, only the header gains __metadata__["crc32"]. The file is
replaced atomically (temp file, fsync, rename).

usage: /usr/bin/python3 tools/st_add_checksums.py FILE.safetensors [...]
"""
import json
import os
import struct
import sys
import tempfile
import zlib


def add_checksums(path):
    raw = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8])
    hdr = json.loads(raw[8:8 + n].decode('utf-8'))
    meta = hdr.pop('__metadata__', {})
    buf = raw[8 + n:]
    table = {}
    for name, info in sorted(hdr.items(), key=lambda kv: kv[1]['data_offsets'][0]):
        b, e = info['data_offsets']
        table[name] = '%08x' % zlib.crc32(buf[b:e])
    if meta.get('crc32') is not None:
        if json.loads(meta['crc32']) != table:
            sys.exit('%s: has a checksum table that does not match its tensors' % path)
        return False
    meta['crc32'] = json.dumps(table, separators=(',', ':'))
    out = {'__metadata__': meta}
    out.update(hdr)
    text = json.dumps(out, separators=(',', ':')).encode('utf-8')
    text += b' ' * ((8 - (8 + len(text)) % 8) % 8)
    # a new temporary beside path (O_EXCL: never an existing name or a link)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                               prefix=os.path.basename(path) + '.tmp.')
    try:
        os.fchmod(fd, os.stat(path).st_mode & 0o777)
        with os.fdopen(fd, 'wb') as f:
            f.write(struct.pack('<Q', len(text)))
            f.write(text)
            f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip())
    for p in sys.argv[1:]:
        print('%s: %s' % (p, 'checksums added' if add_checksums(p) else 'already has checksums'))
