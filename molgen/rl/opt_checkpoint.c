/* molgen optimize: the state file (see opt_checkpoint.h). */
#define _POSIX_C_SOURCE 200809L
#include "rl/opt_checkpoint.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/safetensors.h"
#include "base/util.h"
#include "rl/opt_state.h"
#include "train/checkpoint.h"

/* ------------------------------------------------------------ files */

/* A saved setting's JSON value (a new reference; NULL: out of memory): a
 * WORD as its word, an INDEX as its index, the rest as option_table.h
 * writes them (a U64 as a string of digits). */
static json_t *setting_json(const mg_opt_setting *t, const mg_opt_opts *p) {
    if (t->row.kind == MG_KIND_CHOICE && t->word) {
        char w[64];
        mg_setting_format(&t->row, p, w, sizeof w);
        return json_string(w);
    }
    if (t->row.kind == MG_KIND_CHOICE)
        return json_integer(*(const int *)((const char *)p + t->row.offset));
    return mg_setting_to_json(&t->row, p);
}

json_t *mg_opt_options_json(const mg_opt_opts *p) {
    json_t *j = json_object();
    if (!j) return NULL;
    int bad = 0;
    for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++)
        if (MG_OPT_SETTING[i].resume != MG_OPT_FREE)
            bad |= mg_json_put(j, MG_OPT_SETTING[i].row.key, setting_json(&MG_OPT_SETTING[i], p));
    if (bad) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static json_t *str_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* The scorer command as recorded: itself when it is UTF-8 (a JSON string
 * must be), else with every byte >= 0x80 written \xNN (NULL: out of memory);
 * a resume compares these records. */
json_t *mg_opt_scorer_json(const char *cmd) {
    json_t *j = json_string(cmd);
    if (j) return j;
    const size_t n = strlen(cmd);
    char *t = malloc(4 * n + 1), *p = t;
    if (!t) return NULL;
    for (const unsigned char *c = (const unsigned char *)cmd; *c; c++) {
        if (*c < 0x80)
            *p++ = (char)*c;
        else
            p += sprintf(p, "\\x%02x", *c);
    }
    *p = '\0';
    j = json_string(t);
    free(t);
    return j;
}

/* The run's state as JSON text (malloc'ed), NULL when out of memory. */
static char *state_text(const mg_opt *o) {
    json_t *j = json_object(), *mols = json_array(), *mem = json_array();
    char dig[24];
    snprintf(dig, sizeof dig, "%016llx", (unsigned long long)o->prior_digest);
    int bad = !j || !mols || !mem;
    if (bad) {
        json_decref(mols);
        json_decref(mem);
    } else {
        bad = mg_json_put(j, "molecules", mols) | mg_json_put(j, "memory", mem);
    }
    bad = bad || mg_json_put(j, "format", json_integer(OPT_FORMAT)) ||
          mg_json_put(j, "options", mg_opt_options_json(&o->op)) ||
          mg_json_put(j, "prior_digest", json_string(dig)) ||
          (o->op.scorer_cmd && mg_json_put(j, "scorer", mg_opt_scorer_json(o->op.scorer_cmd))) ||
          mg_json_put(j, "step", json_integer(o->step)) ||
          mg_json_put(j, "adam_step", json_integer(o->adam.step)) ||
          mg_json_put(j, "collapse_run", json_integer(o->collapse_run)) ||
          mg_json_put(j, "plateau_run", json_integer(o->plateau_run));
    for (size_t i = 0; !bad && i < o->nmol; i++) {
        const opt_mol *m = &o->mols[i];
        bad = json_array_append_new(
            mols, json_pack("[s s o s f f f I I i]", m->smiles, m->canonical,
                            str_or_null(m->scaffold), m->comps, m->score, m->prior_nll,
                            m->agent_nll, (json_int_t)m->call, (json_int_t)m->step, m->ga));
    }
    for (int k = 0; !bad && k < o->nmem; k++)
        bad = json_array_append_new(mem, json_pack("[I f]", (json_int_t)o->mem[k].mol,
                                                   o->mem[k].score));
    char *text = bad ? NULL : mg_json_dump(j, 17);
    json_decref(j);
    return text;
}

/* bytes of s as a JSON string's contents ('"' and '\\' escaped, control
 * characters as \u00XX): the size a metadata value takes in the header */
static size_t json_str_bytes(const char *s) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        n += *p == '"' || *p == '\\' ? 2 : *p < 0x20 ? 6 : 1;
    return n;
}

/* The most header bytes the state's metadata may take: what the reader
 * takes (MG_ST_MAX_HEADER) less 1 MiB for the tensors' entries and keys;
 * MOLGEN_OPT_STATE_LIMIT (bytes) lowers it, for the tests. */
static size_t state_limit(void) {
    size_t lim = MG_ST_MAX_HEADER - ((size_t)1 << 20);
    const char *e = getenv("MOLGEN_OPT_STATE_LIMIT");
    char *end;
    const unsigned long long v = e ? strtoull(e, &end, 10) : 0;
    if (e && *e && !*end && v > 0 && v < lim) lim = (size_t)v;
    return lim;
}

mg_status mg_opt_save(mg_opt *o, const char *path, mg_error *err) {
    char *text = state_text(o);
    const size_t nt = mg_model_num_tensors(o->agent);
    mg_st_tensor *t = calloc(nt + 2, sizeof *t);
    char cfg[512];
    char *vj = mg_vocab_to_json(o->vocab);
    mg_status rc = MG_OK;
    if (!text || !t || !vj) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory saving %s", path);
        goto done;
    }
    mg_model_config_to_json(mg_model_get_config(o->agent), cfg, sizeof cfg);
    /* the writer refuses what the reader would (before anything is written:
     * the previous state stays whole) */
    const size_t hb = json_str_bytes(text) + json_str_bytes(vj) + json_str_bytes(cfg);
    if (hb > state_limit()) {
        rc = mg_fail(err, MG_ERR_TOO_LONG,
                     "%s not written: the state of %zu scored molecules takes %zu bytes, more "
                     "than the %zu a checkpoint's header may hold (the previous state is kept; "
                     "see docs/reliability.md, state size)",
                     path, o->nmol, hb, state_limit());
        goto done;
    }
    mg_model_st_tensors(o->agent, t, nt);
    const int64_t P = (int64_t)mg_model_num_params(o->agent);
    t[nt] = (mg_st_tensor){.name = "optim.m", .dtype = MG_ST_F32, .ndim = 1, .shape = {P},
                           .data = o->adam.m};
    t[nt + 1] = (mg_st_tensor){.name = "optim.v", .dtype = MG_ST_F32, .ndim = 1, .shape = {P},
                               .data = o->adam.v};
    const mg_st_kv meta[] = {
        {"format", "molgen"}, {"config", cfg}, {"vocab", vj}, {"optimize", text}};
    rc = mg_st_write(path, t, nt + 2, meta, 4, err);
done:
    free(text);
    free(t);
    free(vj);
    return rc;
}

/* ------------------------------------------------------------ resume */

/* A saved setting into p through the command line's parser, so that a
 * value outside its range (an edited file) is refused with the command
 * line's words: "bad value '5000' for --batch (an integer in [1, 4096])". */
static mg_status setting_from_json(const mg_opt_setting *t, const json_t *v, mg_opt_opts *p,
                                   mg_error *err) {
    const mg_setting *s = &t->row;
    char text[64];
    int ok;
    switch (s->kind) {
    case MG_KIND_U64:
    case MG_KIND_CHOICE:
        if (s->kind == MG_KIND_CHOICE && !t->word) { /* INDEX: an integer in [0, hi] */
            const json_int_t k = json_integer_value(v);
            if (!(ok = json_is_integer(v))) break;
            snprintf(text, sizeof text, "%lld", (long long)k);
            if (k < s->ilo || k > s->ihi)
                return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" is %s: not one of 0..%lld (%s)",
                               s->key, text, (long long)s->ihi, s->choices);
            *(int *)((char *)p + s->offset) = (int)k;
            return MG_OK;
        }
        /* longer than any word or 2^64's digits: refused, not cut */
        if ((ok = json_is_string(v) && strlen(json_string_value(v)) < sizeof text))
            snprintf(text, sizeof text, "%s", json_string_value(v));
        break;
    case MG_KIND_F64:
        if ((ok = json_is_number(v))) snprintf(text, sizeof text, "%.17g", json_number_value(v));
        break;
    default:
        if ((ok = json_is_integer(v)))
            snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
    }
    if (!ok) return mg_fail(err, MG_ERR_FORMAT, "option \"%s\" missing or not a %s", s->key,
                            s->kind == MG_KIND_F64 ? "number"
                            : s->kind == MG_KIND_U64 || t->word ? "string of < 64 bytes"
                                                                  : "integer");
    mg_status rc = mg_setting_parse(s, NULL, text, p, err);
    if (rc) {
        const mg_error e0 = *err; /* the message is an argument: not in place */
        return mg_fail(err, MG_ERR_FORMAT, "option \"%s\": %s", s->key, e0.message);
    }
    return MG_OK;
}

mg_status mg_opt_options_from_json(const json_t *j, mg_opt_opts *p, mg_error *err) {
    for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++) {
        const mg_opt_setting *t = &MG_OPT_SETTING[i];
        if (t->resume == MG_OPT_FREE) continue;
        /* the settings added after the format's first states: missing there,
         * and then read as what those runs did (NULL: the default) */
        static const struct { const char *key, *then; } later[] = {
            {"helper", NULL},      {"ga_offspring", NULL},       {"ga_mutation", NULL},
            {"rank_coef", NULL},   {"constrain_method", "mask"}, {"replay_loops", NULL},
            {"ga_pool", NULL},
        };
        size_t k = 0;
        while (k < sizeof later / sizeof *later && strcmp(t->row.key, later[k].key)) k++;
        if (k < sizeof later / sizeof *later && !json_object_get(j, t->row.key)) {
            mg_opt_opts d;
            mg_opt_opts_default(&d);
            memcpy((char *)p + t->row.offset, (const char *)&d + t->row.offset,
                   t->row.kind == MG_KIND_F64 ? sizeof(double) : sizeof(int));
            if (later[k].then) {
                const mg_status rc = mg_setting_parse(&t->row, NULL, later[k].then, p, err);
                if (rc) return rc;
            }
            continue;
        }
        const mg_status rc = setting_from_json(t, json_object_get(j, t->row.key), p, err);
        if (rc) return rc;
    }
    return mg_opt_opts_check(p, err);
}

/* the "optimize" JSON of checkpoint path (a new reference) and the file */
static mg_status load_state(const char *path, mg_st_file **f, json_t **j, mg_error *err) {
    mg_status rc = mg_st_load(path, f, err);
    if (rc) return rc;
    const char *t = mg_st_meta(*f, "optimize");
    if (!t) {
        mg_st_free(*f);
        *f = NULL;
        return mg_fail(err, MG_ERR_FORMAT, "%s is not a checkpoint of molgen optimize", path);
    }
    rc = mg_json_parse(t, strlen(t), j, err);
    if (!rc && json_integer_value(json_object_get(*j, "format")) != OPT_FORMAT)
        rc = mg_fail(err, MG_ERR_FORMAT, "%s: unknown optimize format", path);
    if (rc) {
        json_decref(*j);
        *j = NULL;
        mg_st_free(*f);
        *f = NULL;
    }
    return rc;
}

mg_status mg_opt_read_options(const char *path, mg_opt_opts *opts, mg_error *err) {
    mg_st_file *f;
    json_t *j;
    mg_status rc = load_state(path, &f, &j, err);
    if (rc) return rc;
    rc = mg_opt_options_from_json(json_object_get(j, "options"), opts, err);
    if (rc) {
        const mg_error e0 = *err; /* the message is an argument: not in place */
        mg_fail(err, MG_ERR_FORMAT, "%s: %s", path, e0.message);
    }
    json_decref(j);
    mg_st_free(f);
    return rc;
}

/* The first SAME setting of a and b that differs, as its option name
 * without "--" (NULL: none); compared as the command line shows them (reals in the fewest
 * digits that read back as the value: equal texts, equal values). */
static const char *differs(const mg_opt_opts *a, const mg_opt_opts *b) {
    for (size_t i = 0; i < MG_OPT_NUM_SETTINGS; i++) {
        const mg_setting *s = &MG_OPT_SETTING[i].row;
        char x[64], y[64];
        if (MG_OPT_SETTING[i].resume != MG_OPT_SAME) continue;
        mg_setting_format(s, a, x, sizeof x);
        mg_setting_format(s, b, y, sizeof y);
        if (strcmp(x, y)) return s->cli;
    }
    return NULL;
}

static char *dup_json(const json_t *v) {
    const char *s = json_string_value(v);
    return s ? strdup(s) : NULL;
}

/* an element of a saved array: a number in [lo, hi] */
static int num_in(const json_t *a, size_t i, double lo, double hi, double *v) {
    const json_t *x = json_array_get(a, i);
    *v = json_number_value(x);
    return json_is_number(x) && *v >= lo && *v <= hi;
}

/* The scored molecules and the memory, each checked (the file may have been
 * edited): every molecule a record of a step up to o->step with a score in
 * [0, 1], canonical keys distinct, memory entries distinct molecules that
 * encode, learning scores in [0, 1]. */
static mg_status restore_mols(mg_opt *o, const json_t *mols, const json_t *mem, mg_error *err) {
    size_t i;
    const json_t *e;
    if (!json_is_array(mols) || !json_is_array(mem))
        return mg_fail(err, MG_ERR_FORMAT, "the molecules or the memory are not lists");
    json_array_foreach(mols, i, e) {
        opt_mol m = {0};
        double sc, nll;
        const json_t *sf = json_array_get(e, 2);
        /* 10 fields; 9 in the states written before the GA (an agent's) */
        const json_t *ga = json_array_get(e, 9);
        if ((json_array_size(e) != 9 && json_array_size(e) != 10) || !num_in(e, 4, 0, 1, &sc) ||
            (ga && !(json_is_integer(ga) && (json_integer_value(ga) & ~1) == 0)) ||
            !json_is_integer(json_array_get(e, 7)) || !json_is_integer(json_array_get(e, 8)) ||
            !(json_is_string(sf) || json_is_null(sf)))
            return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu is malformed", i + 1);
        for (int k = 5; k <= 6; k++) { /* was: +-1e300 taken, every resume then failed */
            const char *name = k == 5 ? "prior_nll" : "agent_nll";
            if (!json_is_number(json_array_get(e, (size_t)k)))
                return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu: its %s is not a number",
                               i + 1, name);
            if (!num_in(e, (size_t)k, 0, OPT_NLL_MAX, &nll))
                return mg_fail(err, MG_ERR_FORMAT,
                               "scored molecule %zu: its %s %g is outside [0, %g] nats (no "
                               "model gives it: the file was edited)",
                               i + 1, name, nll, OPT_NLL_MAX);
        }
        m.smiles = dup_json(json_array_get(e, 0));
        m.canonical = dup_json(json_array_get(e, 1));
        m.scaffold = dup_json(json_array_get(e, 2));
        m.comps = dup_json(json_array_get(e, 3));
        m.score = json_number_value(json_array_get(e, 4));
        m.prior_nll = json_number_value(json_array_get(e, 5));
        m.agent_nll = json_number_value(json_array_get(e, 6));
        m.call = json_integer_value(json_array_get(e, 7));
        m.step = json_integer_value(json_array_get(e, 8));
        m.ga = ga ? (int)json_integer_value(ga) : 0;
        if (!m.smiles || !m.canonical || !m.comps || m.call != (int64_t)i + 1 || m.step < 0 ||
            m.step > o->step || mg_strmap_find(&o->by_key, m.canonical)) {
            mg_opt_mol_clear(&m);
            return mg_fail(err, MG_ERR_FORMAT, "scored molecule %zu is malformed", i + 1);
        }
        mg_status rc = mg_opt_add_mol(o, &m, err);
        if (rc) return rc;
    }
    if (json_array_size(mem) > (size_t)o->op.memory)
        return mg_fail(err, MG_ERR_FORMAT, "the memory holds more than %d molecules",
                       o->op.memory);
    json_array_foreach(mem, i, e) {
        const int64_t k = json_integer_value(json_array_get(e, 0));
        double sc;
        if (!json_is_integer(json_array_get(e, 0)) || k < 0 || k >= (int64_t)o->nmol)
            return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu names no molecule", i + 1);
        if (json_array_size(e) != 2 || !num_in(e, 1, 0, 1, &sc))
            return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu is malformed", i + 1);
        for (size_t q = 0; q < i; q++)
            if (o->mem[q].mol == k)
                return mg_fail(err, MG_ERR_FORMAT, "memory entry %zu repeats molecule %lld", i + 1,
                               (long long)k + 1);
        if (!mg_opt_encode_row(o, 0, o->mols[k].smiles))
            return mg_fail(err, MG_ERR_FORMAT, "memory molecule '%.80s' cannot be encoded",
                           o->mols[k].smiles);
        o->mem[i] = (mg_mem_entry){k, sc};
    }
    o->nmem = (int)json_array_size(mem);
    return MG_OK;
}

/* The scorer recorded in the state j against this run's (--scorer,
 * --scorer-changed). */
static mg_status restore_scorer(mg_opt *o, const json_t *j, const char *path, mg_error *err) {
    /* the scorer: the cache, the memory and the diversity filter hold its
     * scores, so another one is refused unless asked for (none recorded:
     * an older molgen's state, taken) */
    const json_t *js0 = json_object_get(j, "scorer");
    const char *was = json_string_value(js0);
    if (js0 && !was)
        return mg_fail(err, MG_ERR_FORMAT, "the recorded scorer command is not a string");
    json_t *now = o->op.scorer_cmd ? mg_opt_scorer_json(o->op.scorer_cmd) : NULL;
    mg_status rc = MG_OK;
    const int other = was && now && strcmp(was, json_string_value(now));
    if (was && other && !o->op.scorer_changed)
        rc = mg_fail(err, MG_ERR_MISMATCH,
                     "%s was scored by --scorer '%.300s', not '%.300s': a resumed run keeps its "
                     "scorer (its cache and memory hold that scorer's scores); give the same "
                     "--scorer, or add --scorer-changed to go on with the new one (the scores "
                     "so far are kept)",
                     path, was, json_string_value(now));
    else if (o->op.scorer_cmd && !now)
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
    o->scorer_other = other;
    json_decref(now);
    if (rc) return rc;
    if (was && !(o->saved_scorer = strdup(was))) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    return MG_OK;
}

/* The agent's parameters, Adam's moments and the step counters of the
 * state file f and its JSON j. */
static mg_status restore_tensors(mg_opt *o, mg_st_file *f, const json_t *j, mg_error *err) {
    const size_t P = mg_model_num_params(o->agent), nt = mg_model_num_tensors(o->agent);
    mg_status rc = mg_ckpt_check_state(f, P, err);
    for (size_t i = 0; !rc && i < nt; i++) {
        const mg_param_info *ti = mg_model_tensor(o->agent, i);
        rc = mg_st_copy(f, ti->name, MG_ST_F32, ti->ndim, ti->shape,
                        mg_model_params(o->agent) + ti->offset, ti->numel * sizeof(float), err);
    }
    const int64_t shp[1] = {(int64_t)P};
    if (!rc) rc = mg_st_copy(f, "optim.m", MG_ST_F32, 1, shp, o->adam.m, P * sizeof(float), err);
    if (!rc) rc = mg_st_copy(f, "optim.v", MG_ST_F32, 1, shp, o->adam.v, P * sizeof(float), err);
    /* counters: steps within 2^40, Adam's at most 1 + --augmented-memory per step */
    const json_t *js = json_object_get(j, "step"), *ja = json_object_get(j, "adam_step"),
                 *jc = json_object_get(j, "collapse_run"),
                 *jp = json_object_get(j, "plateau_run");
    o->step = json_integer_value(js);
    o->adam.step = json_integer_value(ja);
    o->collapse_run = json_integer_value(jc);
    o->plateau_run = json_integer_value(jp);
    if (!rc && (!json_is_integer(js) || !json_is_integer(ja) || !json_is_integer(jc) ||
                !json_is_integer(jp) || o->plateau_run < 0 || o->plateau_run > o->step ||
                o->step < 0 || o->step > ((int64_t)1 << 40) || o->adam.step < 0 ||
                o->adam.step > o->step * (1 + o->op.aug_rounds + o->op.replay_loops) ||
                o->collapse_run < 0 ||
                o->collapse_run > o->step))
        rc = mg_fail(err, MG_ERR_FORMAT, "the step counters (step %lld, Adam step %lld) are "
                     "malformed", (long long)o->step, (long long)o->adam.step);
    return rc;
}

mg_status mg_opt_restore(mg_opt *o, const char *path, mg_error *err) {
    mg_st_file *f;
    json_t *j;
    mg_status rc = load_state(path, &f, &j, err);
    if (rc) return rc;
    mg_opt_opts saved = o->op;
    char dig[24];
    snprintf(dig, sizeof dig, "%016llx", (unsigned long long)o->prior_digest);
    const char *pd = json_string_value(json_object_get(j, "prior_digest"));
    const char *which = NULL;
    if ((rc = mg_opt_options_from_json(json_object_get(j, "options"), &saved, err))) goto done;
    if (!pd || strcmp(pd, dig)) {
        rc = mg_fail(err, MG_ERR_MISMATCH, "%s was made from another prior (its parameters differ)",
                     path);
        goto done;
    }
    if ((which = differs(&saved, &o->op))) {
        rc = mg_fail(err, MG_ERR_MISMATCH, "%s was made with another --%s (a resumed run keeps it)",
                     path, which);
        goto done;
    }
    if ((rc = restore_scorer(o, j, path, err)) || (rc = restore_tensors(o, f, j, err))) goto done;
    rc = restore_mols(o, json_object_get(j, "molecules"), json_object_get(j, "memory"), err);
done:
    if (rc && rc != MG_ERR_MISMATCH && strncmp(err->message, path, strlen(path))) {
        const mg_error e0 = *err; /* the message is an argument: not in place */
        mg_fail(err, rc, "%s: %s", path, e0.message);
    }
    json_decref(j);
    mg_st_free(f);
    return rc;
}
