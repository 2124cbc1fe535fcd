/* The chemistry helper's client (chem_helper.h) against the real helper
 * (python -m molgen.chem_helper: RDKit answers; skipped with a note when
 * the interpreter has no RDKit) and against stand-in helpers written in sh
 * that lie, die, hang, refuse or greet wrongly: each must be one error that
 * names the request, never a crash or a wrong molecule taken as true. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "rl/chem_helper.h"
#include "rl/scorer_process.h"
#include "mg_test.h"

#define HELLO "printf 'molgen-chem-helper\\t1\\trdkit x\\n'"

static int contains(const char *s, const char *part) { return s && strstr(s, part) != NULL; }

/* A stand-in helper: greets, then runs BODY for the requests. */
static mg_chem *fake(const char *body, double timeout, mg_error *e) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "read l; " HELLO "; %s", body);
    mg_chem *h = NULL;
    mg_status rc = mg_chem_start(cmd, timeout, &h, e);
    CHECK(rc == MG_OK);
    return h;
}

static void test_real_helper(void) {
    mg_chem *h = NULL;
    mg_error e;
    if (mg_chem_start(NULL, 60, &h, &e)) {
        if (contains(e.message, "RDKit") || contains(e.message, "status 3")) {
            printf("note: no RDKit for the default helper, real-helper checks skipped: %s\n",
                   e.message);
            return;
        }
        CHECK(0 && "the default helper did not start");
        printf("  %s\n", e.message);
        return;
    }
    /* L-leucine in three spellings: one canonical string; a non-molecule: NULL */
    const char *in[4] = {"CC(C)C[C@H](N)C(=O)O", "OC(=O)[C@@H](N)CC(C)C", "N[C@@H](CC(C)C)C(O)=O",
                         "C1CC"};
    char *out[4];
    CHECK(mg_chem_canon(h, in, 4, out, &e) == MG_OK);
    CHECK(out[0] && out[1] && out[2] && !out[3]);
    CHECK(out[0] && out[1] && !strcmp(out[0], out[1]) && out[2] && !strcmp(out[0], out[2]));
    for (int i = 0; i < 4; i++) free(out[i]);
    /* offspring: acyclic halide chains at mutation rate 0 give one Cl and
     * one Br (graph_ga's chain crossover); the same seed, the same children */
    const char *par[4] = {"ClCCCCCCCCCl", "BrCCCCCCCCBr", "ClCCCCCCCCCl", "BrCCCCCCCCBr"};
    char *k1[2], *k2[2];
    CHECK(mg_chem_offspring(h, 42, 0.0, par, 2, k1, &e) == MG_OK);
    CHECK(mg_chem_offspring(h, 42, 0.0, par, 2, k2, &e) == MG_OK);
    for (int i = 0; i < 2; i++) {
        CHECK(k1[i] && k2[i] && !strcmp(k1[i], k2[i]));
        CHECK(contains(k1[i], "Cl") && contains(k1[i], "Br"));
        CHECK(k1[i] && !contains(strstr(k1[i], "Cl") + 2, "Cl")); /* one Cl only */
        free(k1[i]), free(k2[i]);
    }
    /* randomized spellings through the helper's verb */
    const char *mol[1] = {"CC(C)C[C@H](N)C(=O)O"};
    const uint64_t seed[1] = {7};
    char *sp[3];
    CHECK(mg_chem_randomize(h, mol, seed, 1, 3, sp, &e) == MG_OK);
    for (int i = 0; i < 3; i++) {
        CHECK(sp[i] != NULL);
        free(sp[i]);
    }
    mg_chem_free(h);
}

static void test_faults(void) {
    mg_error e;
    mg_chem *h = NULL;
    const char *one[1] = {"CCO"};
    char *out[2];
    /* no RDKit: the helper exits 3 before greeting; the error says what to install */
    CHECK(mg_chem_start("echo 'no RDKit' >&2; exit 3", 5, &h, &e) != MG_OK && !h);
    CHECK(contains(e.message, "python3-rdkit") && contains(e.message, "status 3"));
    /* a process that is not the helper (a scorer answering a number) */
    CHECK(mg_chem_start("read l; echo 0.5", 5, &h, &e) == MG_ERR_FORMAT && !h);
    CHECK(contains(e.message, "is not molgen's chemistry helper") && contains(e.message, "0.5"));
    /* lying: a canonical answer that is not SMILES */
    h = fake("while read l; do echo 'C1CC(('; done", 5, &e);
    CHECK(mg_chem_canon(h, one, 1, out, &e) == MG_ERR_FORMAT && !out[0]);
    CHECK(contains(e.message, "not a SMILES") && contains(e.message, "CCO"));
    mg_chem_free(h);
    /* lying: two fields for one canonical answer */
    h = fake("while read l; do printf 'CCO\\tCCO\\n'; done", 5, &e);
    CHECK(mg_chem_canon(h, one, 1, out, &e) == MG_ERR_FORMAT);
    CHECK(contains(e.message, "more than one field"));
    mg_chem_free(h);
    /* refusing: an !error reply is an error naming the request */
    h = fake("while read l; do printf '!error\\tcanon: bad\\n'; done", 5, &e);
    CHECK(mg_chem_canon(h, one, 1, out, &e) == MG_ERR_FORMAT);
    CHECK(contains(e.message, "refused") && contains(e.message, "canon: bad"));
    mg_chem_free(h);
    /* offspring: fewer and more children than pairs */
    const char *par[4] = {"CCO", "CCN", "CCC", "CCCl"};
    h = fake("while read l; do echo 'CCOCCN'; done", 5, &e);
    CHECK(mg_chem_offspring(h, 1, 0.0, par, 2, out, &e) == MG_ERR_FORMAT && !out[0] && !out[1]);
    CHECK(contains(e.message, "1 children for 2 parent pairs"));
    mg_chem_free(h);
    h = fake("while read l; do printf 'CCO\\tCCN\\tCCC\\n'; done", 5, &e);
    CHECK(mg_chem_offspring(h, 1, 0.0, par, 2, out, &e) == MG_ERR_FORMAT);
    CHECK(contains(e.message, "more children than the 2 parent pairs"));
    mg_chem_free(h);
    /* an empty field is "no child", not an error */
    h = fake("while read l; do printf '\\tCCOC\\n'; done", 5, &e);
    CHECK(mg_chem_offspring(h, 1, 0.0, par, 2, out, &e) == MG_OK && !out[0] && out[1]);
    free(out[1]);
    CHECK(mg_chem_offspring(h, 1, 1.5, par, 2, out, &e) == MG_ERR_ARG); /* rate outside [0, 1] */
    mg_chem_free(h);
    /* dying after the greeting */
    h = fake("exit 5", 5, &e);
    CHECK(mg_chem_canon(h, one, 1, out, &e) == MG_ERR_IO);
    CHECK(contains(e.message, "chemistry helper exited with status 5"));
    mg_chem_free(h);
    /* hanging: no answer within the timeout */
    h = fake("sleep 30", 2, &e); /* 2 s: the greeting under a loaded ASan run */
    CHECK(mg_chem_canon(h, one, 1, out, &e) == MG_ERR_IO);
    CHECK(contains(e.message, "chemistry helper gave no answer") &&
          contains(e.message, "--scorer-timeout"));
    mg_chem_free(h);
}

static void pause_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0) {} /* EINTR: the rest */
}

/* Bytes already in the pipe when molgen asks: before the first request they
 * are its answer (a program that speaks first: the greeting check judges it,
 * whichever side was quicker; CI once saw 'echo hello' called a scorer that
 * wrote too many lines); after an answered request they are a line too many,
 * which would shift every answer after it. The pauses fix the order. */
static void test_bytes_before_the_request(void) {
    mg_error e;
    mg_scorer *s = NULL;
    char *line[1];
    const char *what[1] = {"CCO"};
    CHECK(mg_scorer_start("echo 0.5; cat >/dev/null", 5, &s, &e) == MG_OK);
    pause_s(0.3);
    CHECK(mg_scorer_lines(s, "CCO\n", 4, 1, line, what, &e) == MG_OK && !strcmp(line[0], "0.5"));
    mg_scorer_free(s);
    /* ... and when it has exited too: its answer, not the broken pipe */
    CHECK(mg_scorer_start("echo 0.25", 5, &s, &e) == MG_OK);
    pause_s(0.3);
    CHECK(mg_scorer_lines(s, "CCO\n", 4, 1, line, what, &e) == MG_OK && !strcmp(line[0], "0.25"));
    mg_scorer_free(s);
    /* the line too many right after the answer (two writes): read with it,
     * or seen before the next request; either way the same error */
    CHECK(mg_scorer_start("while read l; do echo 1; echo 2; done", 5, &s, &e) == MG_OK);
    mg_status rc = mg_scorer_lines(s, "CCO\n", 4, 1, line, what, &e);
    if (rc == MG_OK) {
        CHECK(!strcmp(line[0], "1"));
        pause_s(2.0);
        rc = mg_scorer_lines(s, "CCO\n", 4, 1, line, what, &e);
    }
    CHECK(rc == MG_ERR_FORMAT && contains(e.message, "more lines than molecules asked"));
    if (rc != MG_ERR_FORMAT) printf("  got %d: %s\n", (int)rc, rc ? e.message : line[0]);
    mg_scorer_free(s);
    /* a program that greets unasked is judged by its greeting */
    mg_chem *h = NULL;
    CHECK(mg_chem_start("echo hello; cat >/dev/null", 5, &h, &e) == MG_ERR_FORMAT && !h);
    CHECK(contains(e.message, "is not molgen's chemistry helper") && contains(e.message, "hello"));
    CHECK(mg_chem_start("echo hello", 5, &h, &e) == MG_ERR_FORMAT && !h);
    CHECK(contains(e.message, "is not molgen's chemistry helper") && contains(e.message, "hello"));
}

int main(void) {
    test_bytes_before_the_request();
    test_faults();
    test_real_helper();
    return tu_fail ? (printf("test_chem_helper: %d of %d checks failed\n", tu_fail,
                             tu_fail + tu_pass), 1)
                   : (printf("test_chem_helper: %d checks passed\n", tu_pass), 0);
}
