/* molgen's chemistry helper, client side: the process molgen optimize starts
 * beside the user's scorer for what needs RDKit (python/molgen/chem_helper.py
 * is the server; its docstring is the protocol), so that every lever works
 * with a scorer that answers one number per line and nothing else:
 *   canon      RDKit's canonical SMILES of each sampled molecule (the budget
 *              and cache key, as PMO counts: two spellings, one call);
 *   randomize  Augmented Memory's randomized spellings;
 *   offspring  graph-GA children of parent pairs (molgen.graph_ga).
 *
 * The command (run by /bin/sh -c, in its own process group, through the
 * scorer client of rl/scorer_process.h: the same checks and timeouts) is
 * MOLGEN_CHEM_HELPER from the environment when set, else
 * mg_chem_default_command(): the Python molgen was built with
 * (MG_PYTHON, Debian's /usr/bin/python3) on the source tree's python/
 * folder first on PYTHONPATH (an installed molgen finds its package on the
 * interpreter's own path). Nothing it says is trusted: a canonical SMILES
 * or child that is not SMILES text, a reply with the wrong number of
 * fields, an `!error` reply, the helper exiting, hanging or lying at start
 * are each one error naming the request (MG_ERR_FORMAT / MG_ERR_IO).
 *
 * Conventions: errors.h; nothing prints; not thread-safe. */
#ifndef MG_CHEM_HELPER_H
#define MG_CHEM_HELPER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_chem mg_chem;

/* The command molgen starts when MOLGEN_CHEM_HELPER is unset (static). */
const char *mg_chem_default_command(void);

/* Starts the helper (command NULL: MOLGEN_CHEM_HELPER, else the default)
 * and checks its greeting; timeout_s > 0: the longest wait for a reply
 * line. A helper that cannot start (no RDKit: it exits 3) is an error that
 * says what to install. */
mg_status mg_chem_start(const char *command, double timeout_s, mg_chem **out, mg_error *err);
void mg_chem_free(mg_chem *h); /* NULL fine */
void mg_chem_set_stop(mg_chem *h, const volatile sig_atomic_t *stop); /* as mg_scorer_set_stop */

/* Canonical SMILES of smiles[0..n) into out[n] (malloc'ed; NULL where RDKit
 * cannot read the molecule). */
mg_status mg_chem_canon(mg_chem *h, const char *const *smiles, size_t n, char **out,
                        mg_error *err);

/* One child per parent pair (parents[2i], parents[2i+1]), i < npairs, into
 * out[npairs] (malloc'ed canonical SMILES; NULL where no child passed the
 * checks); crossover then a mutation with probability rate in [0, 1]; the
 * same (seed, pairs, rate) give the same children. */
mg_status mg_chem_offspring(mg_chem *h, uint64_t seed, double rate, const char *const *parents,
                            size_t npairs, char **out, mg_error *err);

/* Augmented Memory's spellings, as mg_scorer_randomize (rl/scorer_process.h). */
mg_status mg_chem_randomize(mg_chem *h, const char *const *smiles, const uint64_t *seeds, size_t n,
                            int k, char **out, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_CHEM_HELPER_H */
