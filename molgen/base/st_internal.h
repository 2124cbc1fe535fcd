/* molgen safetensors: helpers shared by the reader (safetensors.c) and the
 * writer (safetensors_write.c); not part of safetensors.h. */
#ifndef MG_ST_INTERNAL_H
#define MG_ST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* 1 on a little-endian host (the format's byte order; others are refused). */
int mg_st_host_le(void);
/* *out = prod(shape) * elsize; -1 on a negative dimension or overflow. */
int mg_st_nbytes(const int64_t *shape, int ndim, size_t elsize, uint64_t *out);

#endif /* MG_ST_INTERNAL_H */
