"""Whole-file outputs: written to a new temporary beside the target and
renamed over it, so a reader never sees half a file.

The temporary comes from tempfile.mkstemp in the target's directory
(O_CREAT | O_EXCL: a name that exists, a planted symbolic link included, is
never followed, written or reused), is given the mode a plain open() would
(0666 less the umask) and is removed on any error."""
import contextlib
import os
import tempfile


def _umask():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    u = os.umask(0o022)  # no /proc: read by setting (not thread-safe; rare)
    os.umask(u)
    return u


@contextlib.contextmanager
def atomic_open(path, mode="w", encoding=None):
    """with atomic_open(path) as f: ... writes path whole (mode "w" or "wb")."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=os.path.basename(path) + ".tmp.")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, encoding=encoding) as f:
            fd = -1
            yield f
            f.flush()
            if "b" in mode:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
