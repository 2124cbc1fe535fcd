/* The one way molgen makes a file whole: write a temporary beside it
 * (util.h's mg_temp_create), then mg_atomic_commit: flushed, fsynced,
 * closed, renamed over the target and the directory fsynced, so that after
 * a crash or a power cut the target is the old file or the new one, never a
 * part. Every output goes through it: checkpoints and models
 * (safetensors_write.c) and the commands' files (cli_util.c's
 * mg_cli_atomic_commit).
 *
 * Conventions: errors.h; nothing prints. */
#ifndef MG_ATOMIC_FILE_H
#define MG_ATOMIC_FILE_H

#include <stdio.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Commits the temporary f (at tmp; ok: every write succeeded) over target:
 * on any failure (a write error, a full disk at flush or fsync, a rename
 * across devices) the temporary is removed, the target left as it was, and
 * the error is MG_ERR_IO "error writing NAME: <reason> (nothing written)"
 * (name: the path as the user gave it). A failed fsync of the directory
 * after the rename is MG_ERR_IO too ("NAME is written but ..."). f is
 * closed in every case. */
mg_status mg_atomic_commit(FILE *f, int ok, const char *tmp, const char *target, const char *name,
                           mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_ATOMIC_FILE_H */
