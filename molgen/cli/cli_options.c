/* molgen: the command line from the option tables (see cli_options.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_options.h"

#include <getopt.h>
#include <stdarg.h>
#include <string.h>

#include "cli_util.h"

/* getopt_long values: row i of the tables (together) is MG_CLI_ROW + i. */
enum { MG_CLI_ROW = 256 };

static size_t rows_before(const mg_cli_spec *spec, size_t t) {
    size_t n = 0;
    for (size_t i = 0; i < t; i++) n += spec->tables[i].n;
    return n;
}

/* Row k of the tables together. */
static const mg_setting *row_at(const mg_cli_spec *spec, size_t k) {
    for (size_t t = 0; t < spec->n_tables; k -= spec->tables[t++].n)
        if (k < spec->tables[t].n) return &spec->tables[t].rows[k];
    return NULL;
}

static size_t short_row(const mg_cli_spec *spec, int c) {
    const size_t total = rows_before(spec, spec->n_tables);
    size_t k = 0;
    while (k < total && row_at(spec, k)->short_name != c) k++;
    return k;
}

/* The option as given ("--top-p", "-n"), from the argv element that held
 * it: the one before a separate value, else the last one read. */
static void given_name(char **argv, const char *value, char *out, size_t n) {
    const char *e = argv[optind - 1];
    if (value && value == e && optind >= 2) e = argv[optind - 2];
    const size_t len = e[0] == '-' && e[1] == '-' ? strcspn(e, "=") : 2;
    snprintf(out, n, "%.*s", (int)len, e);
}

int mg_cli_read(const mg_cli_spec *spec, int argc, char **argv, mg_cli_value *vals) {
    const size_t total = rows_before(spec, spec->n_tables);
    struct option opts[2 * MG_CLI_MAX_ROWS + 2];
    char shorts[2 * MG_CLI_MAX_ROWS + 2] = "h";
    size_t k = 0, ns = 1;
    if (total > MG_CLI_MAX_ROWS) return mg_cli_usage(spec->name, "more options than MG_CLI_MAX_ROWS");
    for (size_t i = 0; i < total; i++) {
        const mg_setting *s = row_at(spec, i);
        const int has = s->kind == MG_KIND_FLAG ? no_argument : required_argument;
        opts[k++] = (struct option){s->cli, has, NULL, MG_CLI_ROW + (int)i};
        if (s->alias) opts[k++] = (struct option){s->alias, has, NULL, MG_CLI_ROW + (int)i};
        if (s->short_name) shorts[ns++] = s->short_name;
        if (s->short_name && has) shorts[ns++] = ':';
        vals[i].opt[0] = 0;
        vals[i].text = NULL;
    }
    shorts[ns] = 0;
    opts[k++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[k] = (struct option){NULL, 0, NULL, 0};
    const char *v;
    int o;
    mg_cli_begin();
    while ((o = mg_cli_next(spec->name, argc, argv, shorts, opts, &v)) != -1) {
        if (o == -2) return 2;
        if (o == 'h') {
            mg_cli_help(stdout, spec);
            return -1;
        }
        const size_t i = o >= MG_CLI_ROW ? (size_t)(o - MG_CLI_ROW) : short_row(spec, o);
        vals[i].text = v;
        given_name(argv, v, vals[i].opt, sizeof vals[i].opt);
    }
    return 0;
}

int mg_cli_apply(const mg_cli_spec *spec, size_t t, const mg_cli_value *vals) {
    const mg_cli_table *tb = &spec->tables[t];
    vals += rows_before(spec, t);
    for (size_t i = 0; i < tb->n; i++) {
        mg_error e;
        if (vals[i].opt[0] &&
            mg_setting_parse(&tb->rows[i], vals[i].opt, vals[i].text, tb->base, &e))
            return mg_cli_usage(spec->name, "%s", e.message);
    }
    return 0;
}

int mg_cli_parse(const mg_cli_spec *spec, int argc, char **argv, mg_cli_value *vals) {
    mg_cli_value own[MG_CLI_MAX_ROWS];
    vals = vals ? vals : own;
    int rc = mg_cli_read(spec, argc, argv, vals);
    for (size_t t = 0; !rc && t < spec->n_tables; t++) rc = mg_cli_apply(spec, t, vals);
    return rc;
}

int mg_cli_usage(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "molgen %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see molgen %s --help)\n", cmd);
    va_end(ap);
    return 2;
}

/* One option's help: its names, then its text wrapped at 79 columns under
 * column 23. */
static void help_text(FILE *f, const char *head, const char *text) {
    fputs(head, f);
    int col = (int)strlen(head);
    if (col > 21) {
        fputc('\n', f);
        col = 0;
    }
    fprintf(f, "%*s", 23 - col, "");
    col = 23;
    for (const char *p = text; *p;) {
        const size_t w = strcspn(p, " ");
        if (col > 23 && col + 1 + (int)w > 79) {
            fprintf(f, "\n%23s", "");
            col = 23;
        } else if (col > 23) {
            fputc(' ', f);
            col++;
        }
        fwrite(p, 1, w, f);
        col += (int)w;
        p += w;
        while (*p == ' ') p++;
    }
    fputc('\n', f);
}

/* "  -n, --n, --num N" and "help (default D; RANGE) [same on resume]" */
static void help_row(FILE *f, const mg_setting *s, const void *base) {
    char head[128], text[1600], def[64], range[96];
    int k = snprintf(head, sizeof head, "  ");
    if (s->short_name) k += snprintf(head + k, sizeof head - (size_t)k, "-%c, ", s->short_name);
    k += snprintf(head + k, sizeof head - (size_t)k, "--%s", s->cli);
    if (s->alias) k += snprintf(head + k, sizeof head - (size_t)k, ", --%s", s->alias);
    if (*s->arg) snprintf(head + k, sizeof head - (size_t)k, " %s", s->arg);
    mg_setting_format(s, base, def, sizeof def);
    mg_setting_range(s, range, sizeof range);
    const char *d = s->shown_default ? s->shown_default : def;
    const char *mark = s->resume == MG_RESUME_SAME ? " [same on resume]" : "";
    if (s->kind == MG_KIND_FLAG || (s->kind == MG_KIND_STR && !strcmp(d, "(none)")))
        snprintf(text, sizeof text, "%s%s", s->help, mark);
    else if (s->kind == MG_KIND_STR || s->kind == MG_KIND_CHOICE)
        snprintf(text, sizeof text, "%s (default %s)%s", s->help, d, mark);
    else
        snprintf(text, sizeof text, "%s (default %s; %s)%s", s->help, d, range, mark);
    help_text(f, head, text);
}

static int same_group(const char *a, const char *b) {
    return a == b || (a && b && !strcmp(a, b));
}

void mg_cli_help(FILE *f, const mg_cli_spec *spec) {
    const size_t total = rows_before(spec, spec->n_tables);
    fputs(spec->usage, f);
    for (size_t g = 0; g < total; g++) { /* each group where it first comes */
        const char *group = row_at(spec, g)->group;
        size_t first = 0;
        while (!same_group(row_at(spec, first)->group, group)) first++;
        if (first < g) continue;
        fprintf(f, "%s:\n", group ? group : "Options");
        for (size_t t = 0; t < spec->n_tables; t++)
            for (size_t i = 0; i < spec->tables[t].n; i++)
                if (same_group(spec->tables[t].rows[i].group, group))
                    help_row(f, &spec->tables[t].rows[i], spec->tables[t].base);
    }
    if (spec->notes) fputs(spec->notes, f);
}
