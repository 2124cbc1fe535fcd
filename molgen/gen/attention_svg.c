/* molgen attention maps (see attention_svg.h). */
#define _POSIX_C_SOURCE 200809L
#include "gen/attention_svg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/model.h"
#include "chem/tokenizer.h"

/* ------------------------------------------------------------ statistics */

int mg_is_ring_label(const char *tok, int len) {
    if (!tok) return 0;
    if (len < 0) len = (int)strlen(tok);
    if (len == 1) return tok[0] >= '0' && tok[0] <= '9';
    if (len == 3)
        return tok[0] == '%' && tok[1] >= '0' && tok[1] <= '9' && tok[2] >= '0' && tok[2] <= '9';
    return 0;
}

static int ring_label_value(const char *tok) {
    return tok[0] == '%' ? (tok[1] - '0') * 10 + (tok[2] - '0') : tok[0] - '0';
}

int mg_ring_pairs(const char *const *tokens, int n, int *pair) {
    int open[100];
    for (int i = 0; i < 100; i++) open[i] = -1;
    int closures = 0;
    for (int i = 0; i < n; i++) {
        pair[i] = -1;
        if (!tokens[i] || !mg_is_ring_label(tokens[i], -1)) continue;
        const int lab = ring_label_value(tokens[i]);
        if (open[lab] < 0) {
            open[lab] = i;
        } else {
            pair[i] = open[lab];
            open[lab] = -1;
            closures++;
        }
    }
    return closures;
}

const char *mg_head_label(const mg_head_stats *s) {
    if (s->ring_n > 0 && s->ring >= 0.3) return "ring-closure";
    if (s->prev >= 0.4) return "previous-token";
    if (s->bos >= 0.5) return "BOS-sink";
    if (s->rows > 0 && s->peak < 1.5 * s->peak_uniform) return "diffuse";
    if (s->mean_dist <= 2.0 || s->mean_dist <= 0.4 * s->dist_uniform) return "n-gram/local";
    return "long-range";
}

void mg_head_stats_compute(const float *w, int L, int first, const int *ring_key,
                           mg_head_stats *s) {
    memset(s, 0, sizeof *s);
    if (first < 0) first = 0;
    double dist = 0, prev = 0, bos = 0, ring = 0, peak = 0, peak_u = 0, dist_u = 0;
    int rows = 0, rn = 0;
    for (int i = first; i < L; i++) {
        const float *row = w + (size_t)i * L;
        double d = 0, mx = 0;
        for (int j = 0; j < L; j++) {
            d += (double)row[j] * abs(i - j);
            if (row[j] > mx) mx = row[j];
        }
        peak += mx;
        peak_u += 1.0 / (i + 1);
        dist_u += i / 2.0;
        dist += d;
        prev += i > 0 ? row[i - 1] : 0.0;
        bos += row[0];
        rows++;
        if (ring_key && ring_key[i] >= 0 && ring_key[i] < L) {
            ring += row[ring_key[i]];
            rn++;
        }
    }
    s->rows = rows;
    s->mean_dist = rows ? dist / rows : 0.0;
    s->prev = rows ? prev / rows : 0.0;
    s->bos = rows ? bos / rows : 0.0;
    s->peak = rows ? peak / rows : 0.0;
    s->peak_uniform = rows ? peak_u / rows : 0.0;
    s->dist_uniform = rows ? dist_u / rows : 0.0;
    s->ring_n = rn;
    s->ring = rn ? ring / rn : NAN;
    s->label = mg_head_label(s);
}

/* ------------------------------------------------------------ SVG */

/* viridis at 0, 1/8, ..., 1 */
static const unsigned char VIRIDIS[9][3] = {
    {0x44, 0x01, 0x54}, {0x47, 0x2d, 0x7b}, {0x3b, 0x52, 0x8b},
    {0x2c, 0x72, 0x8e}, {0x21, 0x91, 0x8c}, {0x28, 0xae, 0x80},
    {0x5e, 0xc9, 0x62}, {0xad, 0xdc, 0x30}, {0xfd, 0xe7, 0x25}};

/* Colour of a weight: viridis of sqrt(w), so that the small weights of a
 * spread-out head stay visible (uniform attention over 36 keys is 0.03). */
static void colour(double w, char out[8]) {
    if (!(w >= 0)) w = 0;
    if (w > 1) w = 1;
    double f = sqrt(w) * 8;
    int i = (int)f;
    if (i > 7) i = 7;
    double t = f - i;
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround(VIRIDIS[i][k] * (1 - t) + VIRIDIS[i + 1][k] * t);
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s >= 0x20) fputc(*s, f);
        }
    }
}

/* The drawing's sizes, from L and the longest label. */
typedef struct {
    double cell, font;   /* a matrix cell's side, the labels' font size */
    double lab_w, mat;   /* the label margin, a matrix's side */
    double head_h;       /* a panel's title height */
    double panel_w, panel_h, top, left;
} svg_geometry;

static svg_geometry svg_layout(int L, const char *const *labels) {
    svg_geometry g;
    g.cell = 480.0 / L;
    if (g.cell > 16) g.cell = 16;
    if (g.cell < 6) g.cell = 6;
    g.font = g.cell * 0.75;
    if (g.font > 10) g.font = 10;
    int maxlab = 1;
    for (int i = 0; i < L; i++) {
        int n = labels[i] ? (int)strlen(labels[i]) : 1;
        if (n > maxlab) maxlab = n;
    }
    g.lab_w = maxlab * g.font * 0.62 + 6;
    g.mat = L * g.cell;
    g.head_h = 30;
    g.panel_w = g.lab_w + g.mat + 24;
    g.panel_h = g.head_h + g.mat + g.lab_w + 16;
    g.top = 60;
    g.left = 10;
    return g;
}

/* Panel (l, h): its title and statistics line, the matrix w [L, L] (cells
 * with their values on hover), the labels along both sides. */
static void svg_panel(FILE *f, const svg_geometry *g, const float *w, int L,
                      const char *const *labels, int l, int h, const mg_head_stats *s) {
    const double px = g->left + h * g->panel_w, py = g->top + l * g->panel_h;
    const double mx = px + g->lab_w, my = py + g->head_h, cell = g->cell;
    char col[8];
    fprintf(f,
            "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\">"
            "layer %d head %d</text>\n",
            mx, py + 12, l, h);
    if (s) {
        char ring[16];
        if (s->ring_n)
            snprintf(ring, sizeof ring, "%.2f", s->ring);
        else
            snprintf(ring, sizeof ring, "-");
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#333\">%s: dist "
                "%.2f prev %.2f ring %s</text>\n",
                mx, py + 25, s->label, s->mean_dist, s->prev, ring);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#eeeeee\"/>\n",
            mx, my, g->mat, g->mat);
    for (int i = 0; i < L; i++)
        for (int j = 0; j < L; j++) {
            if (j > i && w[(size_t)i * L + j] == 0.0f) continue; /* masked: background */
            const double x = w[(size_t)i * L + j];
            colour(x, col);
            fprintf(f,
                    "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\">"
                    "<title>",
                    mx + j * cell, my + i * cell, cell, cell, col);
            xml_text(f, labels[i] ? labels[i] : "?");
            fprintf(f, " (%d) -&gt; ", i);
            xml_text(f, labels[j] ? labels[j] : "?");
            fprintf(f, " (%d): %.4f</title></rect>\n", j, x);
        }
    for (int i = 0; i < L; i++) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.1f\" text-anchor=\"end\" "
                "dominant-baseline=\"middle\">",
                mx - 3, my + (i + 0.5) * cell, g->font);
        xml_text(f, labels[i] ? labels[i] : "?");
        fputs("</text>\n", f);
        const double tx = mx + (i + 0.5) * cell, ty = my + g->mat + 3;
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.1f\" "
                "transform=\"rotate(90 %.1f %.1f)\" dominant-baseline=\"middle\">",
                tx, ty, g->font, tx, ty);
        xml_text(f, labels[i] ? labels[i] : "?");
        fputs("</text>\n", f);
    }
    fputs("</g>\n", f);
}

/* The colour scale at (bx, by): the bar (sqrt scale), its ticks, "masked". */
static void svg_scale(FILE *f, double bx, double by) {
    const double bh = 200;
    char col[8];
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\">weight</text>\n"
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"#444\">(sqrt scale)</text>\n",
            bx, by - 18, bx, by - 6);
    for (int k = 0; k < 100; k++) {
        const double t = 1.0 - (k + 0.5) / 100.0; /* position on the bar = sqrt(w) */
        colour(t * t, col);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.2f\" width=\"16\" height=\"%.2f\" fill=\"%s\"/>\n", bx,
                by + k * bh / 100, bh / 100 + 0.2, col);
    }
    static const double ticks[] = {0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0};
    for (size_t k = 0; k < sizeof ticks / sizeof *ticks; k++)
        fprintf(
            f,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" dominant-baseline=\"middle\">%g</text>\n",
            bx + 20, by + bh - sqrt(ticks[k]) * bh, ticks[k]);
    fprintf(
        f,
        "<rect x=\"%.1f\" y=\"%.1f\" width=\"16\" height=\"10\" fill=\"#eeeeee\"/>"
        "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" dominant-baseline=\"middle\">masked</text>\n",
        bx, by + bh + 14, bx + 20, by + bh + 19);
}

int mg_attention_svg(FILE *f, const float *weights, int n_layer, int n_head, int L,
                     const char *const *labels, const char *title, const mg_head_stats *stats) {
    if (!f || !weights || n_layer < 1 || n_head < 1 || L < 1 || !labels) return -1;
    const svg_geometry g = svg_layout(L, labels);
    const double bar_w = 90;
    const double W = g.left + n_head * g.panel_w + bar_w, Hh = g.top + n_layer * g.panel_h + 10;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans Mono, monospace\" "
            "shape-rendering=\"crispEdges\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, Hh, W, Hh);
    fprintf(f, "<text x=\"%.1f\" y=\"22\" font-size=\"16\" font-weight=\"bold\">", g.left);
    xml_text(f, title ? title : "attention");
    fprintf(f,
            "</text>\n<text x=\"%.1f\" y=\"40\" font-size=\"11\" fill=\"#444\">"
            "rows: query (attending) token, columns: key token; grey: masked (future); "
            "hover a cell for its value</text>\n",
            g.left);
    for (int l = 0; l < n_layer; l++)
        for (int h = 0; h < n_head; h++)
            svg_panel(f, &g, weights + ((size_t)l * n_head + h) * (size_t)L * L, L, labels, l, h,
                      stats ? &stats[l * n_head + h] : NULL);
    svg_scale(f, g.left + n_head * g.panel_w + 20, g.top + 20);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------ table */

int mg_attention_tsv(FILE *f, const mg_head_stats *stats, int n_layer, int n_head) {
    fprintf(f, "layer\thead\tmean_distance\tprev_token\tring_closure\tbos\tpeak\tlabel\n");
    for (int i = 0; i < n_layer * n_head; i++) {
        const mg_head_stats *s = &stats[i];
        if (s->ring_n)
            fprintf(f, "%d\t%d\t%.4f\t%.4f\t%.4f\t%.4f\t%.4f\t%s\n", i / n_head, i % n_head,
                    s->mean_dist, s->prev, s->ring, s->bos, s->peak, s->label);
        else
            fprintf(f, "%d\t%d\t%.4f\t%.4f\t-\t%.4f\t%.4f\t%s\n", i / n_head, i % n_head,
                    s->mean_dist, s->prev, s->bos, s->peak, s->label);
    }
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------ one molecule */

void mg_attention_map_free(mg_attention_map *a) {
    if (!a) return;
    free(a->weights);
    free(a->labels);
    free(a->stats);
    memset(a, 0, sizeof *a);
}

mg_status mg_attention_compute(mg_model *m, const mg_vocab *v, const char *smiles,
                               mg_attention_map *out, mg_error *err) {
    if (!m || !v || !smiles || !out) return mg_fail(err, MG_ERR_ARG, "attention: NULL argument");
    memset(out, 0, sizeof *out);
    const mg_model_config *c = mg_model_get_config(m);
    const int N = c->n_layer, H = c->n_head, ctx = c->ctx_len;
    char cut[96];
    const size_t slen = strlen(smiles);
    if (slen > 72)
        snprintf(cut, sizeof cut, "%.60s... (%zu chars)", smiles, slen);
    else
        snprintf(cut, sizeof cut, "%s", smiles);
    int k = 0;
    int32_t *ids = malloc((size_t)(ctx + 1) * sizeof *ids);
    float *logits = NULL;
    int *ring_key = NULL, *pair = NULL;
    mg_error e;
    mg_status rc = MG_OK;
    if (!ids) return mg_fail(err, MG_ERR_NOMEM, "out of memory");
    rc = mg_vocab_encode(v, smiles, ids + 1, ctx, &k, &e);
    if (rc == MG_ERR_TOO_LONG || (rc == MG_OK && k + 1 > ctx)) {
        rc = mg_fail(err, MG_ERR_TOO_LONG,
                     "'%s' has %d tokens; the model takes at most %d (ctx_len %d minus BOS)", cut,
                     k, ctx - 1, ctx);
        goto done;
    }
    if (rc) {
        rc = mg_fail(err, rc, "'%s': %s", cut, e.message);
        goto done;
    }
    if (k == 0) {
        rc = mg_fail(err, MG_ERR_ARG, "empty SMILES");
        goto done;
    }
    ids[0] = MG_BOS;
    const int L = k + 1;
    out->n_layer = N;
    out->n_head = H;
    out->L = L;
    out->k = k;
    logits = malloc((size_t)L * c->vocab_size * sizeof *logits);
    out->weights = malloc((size_t)N * H * L * L * sizeof *out->weights);
    ring_key = malloc((size_t)L * sizeof *ring_key);
    pair = malloc((size_t)L * sizeof *pair);
    out->labels = malloc((size_t)L * sizeof *out->labels);
    out->stats = malloc((size_t)N * H * sizeof *out->stats);
    if (!logits || !out->weights || !ring_key || !pair || !out->labels || !out->stats) {
        rc = mg_fail(err, MG_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = mg_model_logits(m, &(mg_batch){.ids = ids, .B = 1, .T = L}, logits, out->weights,
                              err)))
        goto done;
    for (int i = 0; i < L; i++) out->labels[i] = mg_vocab_token(v, ids[i]);
    out->closures = mg_ring_pairs(out->labels + 1, k, pair);
    ring_key[0] = -1;
    for (int i = 0; i < k; i++) ring_key[i + 1] = pair[i] >= 0 ? pair[i] + 1 : -1;
    for (int l = 0; l < N; l++)
        for (int h = 0; h < H; h++)
            mg_head_stats_compute(out->weights + ((size_t)l * H + h) * L * L, L, 1, ring_key,
                                  &out->stats[l * H + h]);
done:
    free(ids);
    free(logits);
    free(ring_key);
    free(pair);
    if (rc) mg_attention_map_free(out);
    return rc;
}
