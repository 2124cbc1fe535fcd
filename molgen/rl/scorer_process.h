/* molgen scorer client: an external scoring program (molgen optimize
 * --scorer) spoken to through pipes.
 *
 * Protocol. COMMAND is started once, `/bin/sh -c COMMAND`, in its own
 * process group, stderr shared with molgen. molgen writes one SMILES per
 * line to its standard input, flushes after each batch, and reads one line
 * per SMILES from its standard output, in order:
 *   SCORE[\tNAME=VALUE]...
 * SCORE is a decimal number in [0, 1] or "nan" (any case: the scorer cannot
 * score the molecule; molgen counts it invalid), spaces around it allowed. Optional fields: canonical=
 * (the molecule's canonical SMILES: molgen's cache and budget key),
 * scaffold= (its Murcko scaffold: the diversity filter's bucket), and
 * numeric components (name=number, kept in scored.csv); fields that are
 * neither are ignored. Each of canonical=, scaffold= and a component
 * (name=value) is at most MG_SCORER_MAX_FIELD bytes, the components kept
 * together too (longer: MG_ERR_FORMAT naming the molecule and the field):
 * they are kept for every scored molecule in molgen optimize's state.
 * Extension: the request "!randomize\tSEED\tN\tSMILES" is answered by one
 * line of N TAB-separated randomized SMILES of the molecule (or an empty
 * line: none); each must be a SMILES (mg_smiles_syntax_ok) with the
 * request's heavy atoms (the same element multiset, aromatic or not),
 * else MG_ERR_FORMAT naming the line: the agent trains on them.
 *
 * Nothing the scorer says is trusted: a SCORE that is not a number, is
 * infinite or lies outside [0, 1] (refused, never clipped), an answer
 * missing because the scorer exited (seen within 0.2 s + 0.5 s even when
 * a process it started holds its output open) or closed its output, and no
 * answer within the timeout are each MG_ERR_FORMAT / MG_ERR_IO with one message
 * naming the molecule and the scorer's line. SIGPIPE is ignored while the
 * scorer runs (a scorer that closed its input is an EPIPE error).
 *
 * Conventions: errors.h; nothing prints; not thread-safe. */
#ifndef MG_SCORER_H
#define MG_SCORER_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_scorer mg_scorer;

/* The longest canonical=, scaffold= or components of one answer, bytes. */
#define MG_SCORER_MAX_FIELD 1024

/* One answer. valid 0: "nan" (score 0). The strings are owned by the
 * reply (mg_score_reply_clear); canonical / scaffold NULL when not sent;
 * comps "name=value" pairs joined by ';' ("" when none). */
typedef struct {
    int valid;
    double score;
    char *canonical, *scaffold, *comps;
} mg_score_reply;
void mg_score_reply_clear(mg_score_reply *r);

/* Starts COMMAND; timeout_s > 0: the longest wait for the scorer's next
 * line (or for it to take the request). */
mg_status mg_scorer_start(const char *command, double timeout_s, mg_scorer **out, mg_error *err);
/* Closes its input, waits up to a second for it to exit, then kills its
 * process group. NULL fine. */
void mg_scorer_free(mg_scorer *s);
/* stop (may be NULL): when it is nonzero (a signal handler set it), a wait
 * for the scorer ends with MG_ERR_INTERRUPTED instead of waiting for the
 * answer (a slow scorer no longer holds a signal up for a whole batch). */
void mg_scorer_set_stop(mg_scorer *s, const volatile sig_atomic_t *stop);
/* The same client speaks to molgen's chemistry helper (chem_helper.h): who
 * names the process in messages ("scorer" by default), randomize_verb is
 * mg_scorer_randomize's request word ("!randomize" by default), and
 * timeout_option the option messages name ("--scorer-timeout"). The
 * strings must outlive s. */
void mg_scorer_set_role(mg_scorer *s, const char *who, const char *randomize_verb,
                        const char *timeout_option);
/* Lower level, the protocol's one exchange: writes req[0..rlen) (n lines)
 * and reads n answer lines, every check above applied; lines[i] points into
 * s's buffer, NUL-terminated, valid until the next call. what[i] names
 * request i's molecule in messages. */
mg_status mg_scorer_lines(mg_scorer *s, const char *req, size_t rlen, size_t n, char **lines,
                          const char *const *what, mg_error *err);
/* Scores smiles[0..n): replies [n] out (zeroed first; cleared on error). */
mg_status mg_scorer_score(mg_scorer *s, const char *const *smiles, size_t n, mg_score_reply *out,
                          mg_error *err);
/* Randomized spellings: for molecule i, up to k SMILES (seed seeds[i]) into
 * out[i * k .. i * k + k) (malloc'ed; NULL past what the scorer gave). */
mg_status mg_scorer_randomize(mg_scorer *s, const char *const *smiles, const uint64_t *seeds,
                              size_t n, int k, char **out, mg_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MG_SCORER_H */
