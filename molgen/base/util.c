/* molgen shared helpers (see util.h). */
#define _POSIX_C_SOURCE 200809L
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

double mg_now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

uint32_t mg_crc32(const void *p, size_t n) {
    return (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), (const Bytef *)p, n);
}

int mg_temp_create(const char *path, char *tmp, size_t n) {
    static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static uint64_t counter;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    uint64_t state = ((uint64_t)t.tv_sec << 30) ^ (uint64_t)t.tv_nsec ^
                     ((uint64_t)getpid() << 40) ^ (counter++ * 0x9E3779B97F4A7C15ull);
    for (int tries = 0; tries < 100; tries++) {
        uint64_t r = mg_splitmix64(&state);
        char suffix[7];
        for (int i = 0; i < 6; i++, r /= 62) suffix[i] = letters[r % 62];
        suffix[6] = '\0';
        if (snprintf(tmp, n, "%s.tmp.%ld.%s", path, (long)getpid(), suffix) >= (int)n) {
            errno = ENAMETOOLONG;
            return -1;
        }
        const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) return fd;
    }
    errno = EEXIST;
    return -1;
}

void mg_fmt_duration(double s, char *out, size_t n) {
    if (!(s >= 0) || s > 1e7) {
        snprintf(out, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(out, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(out, n, "%lds", t);
}

int mg_default_threads(void) {
    const char *env = getenv("ATTN_NUM_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 1024) return (int)v;
    }
    /* under mpirun the machine's cores are shared by its ranks */
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    long ranks = local ? strtol(local, NULL, 10) : 1;
    if (ranks < 1) ranks = 1;
#ifdef _OPENMP
    const long n = omp_get_num_procs() / ranks;
    return n > 1 ? (int)n : 1;
#else
    (void)ranks;
    return 1;
#endif
}

int mg_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        const unsigned c = *p++;
        if (c < 0x80) continue;
        int more;
        unsigned lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
        if (c >= 0xC2 && c <= 0xDF)
            more = 1;
        else if (c >= 0xE0 && c <= 0xEF)
            more = 2, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4)
            more = 3, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else
            return 0;
        if (end - p < more || *p < lo || *p > hi) return 0;
        for (int k = 0; k < more; k++, p++)
            if ((*p & 0xC0) != 0x80) return 0;
    }
    return 1;
}
