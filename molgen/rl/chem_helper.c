/* molgen's chemistry helper, client side (see chem_helper.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/chem_helper.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rl/scorer_process.h"
#include "chem/smiles_check.h"

#ifndef MG_PYTHON
#define MG_PYTHON "/usr/bin/python3"
#endif

struct mg_chem {
    mg_scorer *proc; /* the line-protocol client, in the helper's role */
    char *command;
};

const char *mg_chem_default_command(void) {
#ifdef MG_PYTHON_DIR
    /* the source tree's package first; single quotes: paths with spaces */
    return "PYTHONPATH='" MG_PYTHON_DIR "'${PYTHONPATH:+:$PYTHONPATH} exec '" MG_PYTHON
           "' -m molgen.chem_helper";
#else
    return "exec '" MG_PYTHON "' -m molgen.chem_helper";
#endif
}

void mg_chem_free(mg_chem *h) {
    if (!h) return;
    mg_scorer_free(h->proc);
    free(h->command);
    free(h);
}

void mg_chem_set_stop(mg_chem *h, const volatile sig_atomic_t *stop) {
    mg_scorer_set_stop(h->proc, stop);
}

/* An "!error<TAB>MESSAGE" reply: the helper refused a request molgen wrote
 * (a bug on one side or the other), said with the request. */
static mg_status refused(const char *line, const char *req, mg_error *err) {
    return mg_fail(err, MG_ERR_FORMAT, "the chemistry helper refused the request '%.120s': %.300s",
                   req, line + 7);
}

mg_status mg_chem_start(const char *command, double timeout_s, mg_chem **out, mg_error *err) {
    *out = NULL;
    if (!command) command = getenv("MOLGEN_CHEM_HELPER");
    if (!command || !*command) command = mg_chem_default_command();
    mg_chem *h = calloc(1, sizeof *h);
    if (!h || !(h->command = strdup(command))) {
        free(h);
        return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    }
    mg_status rc = mg_scorer_start(command, timeout_s, &h->proc, err);
    if (rc) {
        mg_chem_free(h);
        return rc;
    }
    mg_scorer_set_role(h->proc, "chemistry helper", "randomize", "--scorer-timeout");
    const char *what[1] = {"hello"};
    char *line[1];
    mg_error e;
    rc = mg_scorer_lines(h->proc, "hello\n", 6, 1, line, what, &e);
    if (!rc && strncmp(line[0], "molgen-chem-helper\t1\t", 21)) {
        rc = mg_fail(err, MG_ERR_FORMAT,
                     "'%.200s' is not molgen's chemistry helper (protocol 1): it greeted with "
                     "'%.80s' (MOLGEN_CHEM_HELPER sets the command; default %s)",
                     command, line[0], mg_chem_default_command());
    } else if (rc) {
        rc = mg_fail(err, rc,
                     "molgen's chemistry helper '%.200s' did not start: %s. It needs Python 3 "
                     "with RDKit and molgen's Python package (Debian: apt-get install "
                     "python3-rdkit; MOLGEN_CHEM_HELPER sets the command)",
                     command, e.message);
    }
    if (rc) {
        mg_chem_free(h);
        return rc;
    }
    *out = h;
    return MG_OK;
}

/* A reply field the helper may send as a molecule: empty (none) or SMILES
 * text molgen's own grammar reads. */
static mg_status molecule_field(const char *p, size_t l, const char *req, const char *kind,
                                char **dst, mg_error *err) {
    *dst = NULL;
    if (!l) return MG_OK;
    char *s = malloc(l + 1);
    if (!s) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    memcpy(s, p, l);
    s[l] = 0;
    char why[96];
    if (!mg_smiles_syntax_ok(s, why, sizeof why)) {
        mg_status rc = mg_fail(err, MG_ERR_FORMAT,
                               "the chemistry helper's %s '%.120s' for '%.120s' is not a SMILES "
                               "(%s)",
                               kind, s, req, why);
        free(s);
        return rc;
    }
    *dst = s;
    return MG_OK;
}

mg_status mg_chem_canon(mg_chem *h, const char *const *smiles, size_t n, char **out,
                        mg_error *err) {
    memset(out, 0, n * sizeof *out);
    if (!n) return MG_OK;
    size_t rlen = 0;
    for (size_t i = 0; i < n; i++) {
        if (strpbrk(smiles[i], "\t\r\n"))
            return mg_fail(err, MG_ERR_ARG, "a molecule with a newline or tab: '%.80s'", smiles[i]);
        rlen += strlen(smiles[i]) + 7;
    }
    char *req = malloc(rlen + 1), **lines = malloc(n * sizeof *lines);
    mg_status rc = req && lines ? MG_OK : mg_fail(err, MG_ERR_NOMEM, "out of memory");
    size_t o = 0;
    for (size_t i = 0; !rc && i < n; i++) o += (size_t)sprintf(req + o, "canon\t%s\n", smiles[i]);
    if (!rc) rc = mg_scorer_lines(h->proc, req, o, n, lines, smiles, err);
    for (size_t i = 0; !rc && i < n; i++) {
        if (!strncmp(lines[i], "!error\t", 7)) rc = refused(lines[i], smiles[i], err);
        else if (strchr(lines[i], '\t'))
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "the chemistry helper's canonical SMILES for '%.120s' has more than one "
                         "field: '%.120s'",
                         smiles[i], lines[i]);
        else
            rc = molecule_field(lines[i], strlen(lines[i]), smiles[i], "canonical SMILES",
                                &out[i], err);
    }
    if (rc)
        for (size_t i = 0; i < n; i++) free(out[i]), out[i] = NULL;
    free(req);
    free(lines);
    return rc;
}

mg_status mg_chem_offspring(mg_chem *h, uint64_t seed, double rate, const char *const *parents,
                            size_t npairs, char **out, mg_error *err) {
    memset(out, 0, npairs * sizeof *out);
    if (!npairs) return MG_OK;
    if (!(rate >= 0 && rate <= 1))
        return mg_fail(err, MG_ERR_ARG, "mutation rate %g is not in [0, 1]", rate);
    size_t rlen = 64;
    for (size_t i = 0; i < 2 * npairs; i++) {
        if (!*parents[i] || strpbrk(parents[i], "\t\r\n"))
            return mg_fail(err, MG_ERR_ARG, "a parent molecule is empty or holds a newline or tab");
        rlen += strlen(parents[i]) + 1;
    }
    char *req = malloc(rlen + 1), *line[1];
    if (!req) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    size_t o = (size_t)sprintf(req, "offspring\t%llu\t%.17g", (unsigned long long)seed, rate);
    for (size_t i = 0; i < 2 * npairs; i++) o += (size_t)sprintf(req + o, "\t%s", parents[i]);
    req[o++] = '\n';
    const char *what[1] = {parents[0]};
    mg_status rc = mg_scorer_lines(h->proc, req, o, 1, line, what, err);
    if (!rc && !strncmp(line[0], "!error\t", 7)) rc = refused(line[0], "offspring", err);
    const char *p = rc ? NULL : line[0];
    for (size_t i = 0; !rc && i < npairs; i++) {
        const char *t = strchr(p, '\t');
        const size_t l = t ? (size_t)(t - p) : strlen(p);
        if (!t && i + 1 < npairs)
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "the chemistry helper answered %zu children for %zu parent pairs", i + 1,
                         npairs);
        else if (t && i + 1 == npairs)
            rc = mg_fail(err, MG_ERR_FORMAT,
                         "the chemistry helper answered more children than the %zu parent pairs",
                         npairs);
        else
            rc = molecule_field(p, l, parents[2 * i], "child", &out[i], err);
        p = t ? t + 1 : p + l;
    }
    if (rc)
        for (size_t i = 0; i < npairs; i++) free(out[i]), out[i] = NULL;
    free(req);
    return rc;
}

mg_status mg_chem_randomize(mg_chem *h, const char *const *smiles, const uint64_t *seeds, size_t n,
                            int k, char **out, mg_error *err) {
    return mg_scorer_randomize(h->proc, smiles, seeds, n, k, out, err);
}
