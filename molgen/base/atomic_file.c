/* Durable whole-file commits (see atomic_file.h). */
#define _POSIX_C_SOURCE 200809L
#include "base/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fsync of target's directory, so that the rename into it is durable
 * (EINVAL / EROFS: a file system that cannot sync directories). */
static mg_status sync_dir(const char *target, const char *name, mg_error *err) {
    const char *slash = strrchr(target, '/');
    const size_t dl = !slash ? 1 : slash == target ? 1 : (size_t)(slash - target);
    char *dir = malloc(dl + 1);
    if (!dir) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    if (!slash) strcpy(dir, ".");
    else memcpy(dir, target, dl), dir[dl] = '\0';
    mg_status rc = MG_OK;
    const int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        rc = mg_fail(err, MG_ERR_IO, "%s is written but its directory %s cannot be opened to sync: %s",
                     name, dir, strerror(errno));
    else {
        if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
            rc = mg_fail(err, MG_ERR_IO, "%s is written but the sync of its directory %s failed: %s",
                         name, dir, strerror(errno));
        close(fd);
    }
    free(dir);
    return rc;
}

mg_status mg_atomic_commit(FILE *f, int ok, const char *tmp, const char *target, const char *name,
                           mg_error *err) {
    int e = 0;
    if (!ok || fflush(f) != 0 || ferror(f)) e = errno ? errno : EIO;
    else if (fsync(fileno(f)) != 0 && errno != EINVAL && errno != EROFS) e = errno;
    if (fclose(f) != 0 && !e) e = errno;
    if (!e && rename(tmp, target) != 0) e = errno;
    if (e) {
        unlink(tmp);
        return mg_fail(err, MG_ERR_IO, "error writing %s: %s (nothing written)", name, strerror(e));
    }
    return sync_dir(target, name, err);
}
