/* molgen optimize's inception memory (REINVENT's): the M molecules with the
 * highest learning scores seen so far, replayed in later steps.
 *
 * After a step the memory is the old entries plus each of the step's rows
 * that has a molecule (gi >= 0), a learning score s' > 0 and a row the
 * model can read (ok), unless that molecule is in it already (its first
 * score stays); ordered by score, highest first, ties by the lower
 * molecule index; the first M kept. */
#ifndef MG_INCEPTION_MEMORY_H
#define MG_INCEPTION_MEMORY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int64_t mol;  /* the molecule's index in the run */
    double score; /* its learning score s' when it entered */
} mg_mem_entry;

/* The memory after a step, as above, into out [nmem + B + 1]: old [nmem],
 * the step's rows gi, s2, ok [B], M >= 0. Returns the entries kept. */
int mg_memory_update(const mg_mem_entry *old, int nmem, const int64_t *gi, const double *s2,
                     const unsigned char *ok, int B, int M, mg_mem_entry *out);

#ifdef __cplusplus
}
#endif
#endif /* MG_INCEPTION_MEMORY_H */
