/* molgen smiles_check: see smiles_check.h. */
#include "chem/smiles_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chem/tokenizer.h"

/* Writes the reason into why[n] (when given) and returns 0 (not valid). */
static int reject(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int reject(char *why, size_t n, const char *fmt, ...) {
    if (why && n > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, n, fmt, ap);
        va_end(ap);
    }
    return 0;
}

static const char *const k_elements[] = {
    "H",  "He", "Li", "Be", "B",  "C",  "N",  "O",  "F",  "Ne", "Na", "Mg", "Al", "Si", "P",
    "S",  "Cl", "Ar", "K",  "Ca", "Sc", "Ti", "V",  "Cr", "Mn", "Fe", "Co", "Ni", "Cu", "Zn",
    "Ga", "Ge", "As", "Se", "Br", "Kr", "Rb", "Sr", "Y",  "Zr", "Nb", "Mo", "Tc", "Ru", "Rh",
    "Pd", "Ag", "Cd", "In", "Sn", "Sb", "Te", "I",  "Xe", "Cs", "Ba", "La", "Ce", "Pr", "Nd",
    "Pm", "Sm", "Eu", "Gd", "Tb", "Dy", "Ho", "Er", "Tm", "Yb", "Lu", "Hf", "Ta", "W",  "Re",
    "Os", "Ir", "Pt", "Au", "Hg", "Tl", "Pb", "Bi", "Po", "At", "Rn", "Fr", "Ra", "Ac", "Th",
    "Pa", "U",  "Np", "Pu", "Am", "Cm", "Bk", "Cf", "Es", "Fm", "Md", "No", "Lr", "Rf", "Db",
    "Sg", "Bh", "Hs", "Mt", "Ds", "Rg", "Cn", "Nh", "Fl", "Mc", "Lv", "Ts", "Og"};

/* Atomic number of the element symbol s[0..len), 0 if none. */
static int element_z(const char *s, int len) {
    for (size_t i = 0; i < sizeof k_elements / sizeof *k_elements; i++)
        if ((int)strlen(k_elements[i]) == len && strncmp(k_elements[i], s, (size_t)len) == 0)
            return (int)i + 1;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* What the valence rules need of a bracket atom. */
typedef struct {
    int z;      /* atomic number; 0 for '*' */
    int hcount; /* explicit hydrogens */
    int charge;
    int aromatic; /* lowercase symbol: c n o p s se as te b */
} bracket_info;

/* Validate the inside of a bracket atom s[0..len) (without the brackets)
 * and fill *bi. Returns 1 or 0 with a reason (pos = offset of the '[' in the
 * SMILES). */
static int bracket_ok(const char *s, int len, int pos, char *why, size_t n, bracket_info *bi) {
    memset(bi, 0, sizeof *bi);
    int i = 0;
    while (i < len && is_digit(s[i])) /* isotope */
        i++;
    /* symbol */
    if (i >= len) return reject(why, n, "position %d: bracket atom without an element symbol", pos);
    static const char *const arom2[] = {"se", "as", "te"};
    int sym = 0;
    if (s[i] == '*') {
        sym = 1;
    } else if (s[i] >= 'a' && s[i] <= 'z') {
        for (size_t k = 0; k < 3; k++)
            if (i + 1 < len && strncmp(s + i, arom2[k], 2) == 0) sym = 2;
        if (!sym && strchr("bcnops", s[i])) sym = 1;
    } else if (s[i] >= 'A' && s[i] <= 'Z') {
        if (i + 1 < len && s[i + 1] >= 'a' && s[i + 1] <= 'z' && element_z(s + i, 2))
            sym = 2;
        else if (element_z(s + i, 1))
            sym = 1;
    }
    if (!sym)
        return reject(why, n, "position %d: bad element symbol in bracket atom [%.*s]", pos, len,
                      s);
    if (s[i] != '*') {
        char el[2] = {(char)(s[i] >= 'a' ? s[i] - 'a' + 'A' : s[i]), sym == 2 ? s[i + 1] : 0};
        bi->z = element_z(el, sym);
        bi->aromatic = s[i] >= 'a' && s[i] <= 'z';
    }
    i += sym;
    /* chirality */
    if (i < len && s[i] == '@') {
        i++;
        if (i < len && s[i] == '@') {
            i++;
        } else if (i + 1 < len) {
            static const struct {
                const char *cls;
                int max;
            } k_chir[] = {{"TH", 2}, {"AL", 2}, {"SP", 3}, {"TB", 20}, {"OH", 30}};
            int found = -1;
            for (int k = 0; k < 5; k++)
                if (strncmp(s + i, k_chir[k].cls, 2) == 0) found = k;
            if (found >= 0) {
                i += 2;
                int v = 0, nd = 0;
                while (i < len && is_digit(s[i]) && nd < 3) {
                    v = v * 10 + (s[i] - '0');
                    i++;
                    nd++;
                }
                if (nd == 0 || v < 1 || v > k_chir[found].max)
                    return reject(why, n, "position %d: bad chirality in [%.*s]", pos, len, s);
            }
        }
    }
    /* hydrogen count */
    if (i < len && s[i] == 'H') {
        i++;
        bi->hcount = 1;
        if (i < len && is_digit(s[i])) bi->hcount = s[i++] - '0';
    }
    /* charge */
    if (i < len && (s[i] == '+' || s[i] == '-')) {
        char sign = s[i++];
        int q = 1;
        if (i < len && s[i] == sign) {
            i++; /* "++" / "--" */
            q = 2;
        } else {
            int nd = 0, v = 0;
            while (i < len && is_digit(s[i]) && nd < 2) {
                v = v * 10 + (s[i] - '0');
                i++;
                nd++;
            }
            if (nd) q = v;
        }
        bi->charge = sign == '+' ? q : -q;
    }
    /* atom class */
    if (i < len && s[i] == ':') {
        i++;
        int nd = 0;
        while (i < len && is_digit(s[i])) {
            i++;
            nd++;
        }
        if (nd == 0)
            return reject(why, n, "position %d: ':' without a class number in [%.*s]", pos, len, s);
    }
    if (i != len)
        return reject(why, n, "position %d: unexpected '%c' in bracket atom [%.*s]", pos + 1 + i,
                      s[i], len, s);
    return 1;
}

enum { P_NONE, P_ATOM, P_BOND, P_RING, P_OPEN, P_CLOSE, P_DOT };

typedef struct {
    int a, b;
    int order2; /* twice the bond order; implicit counted as single, ':' 0 */
    int arom;   /* no symbol, ':', '/' or '\\': aromatic between aromatic atoms */
    int cyc;    /* on a cycle of the bonds so far (masks; exact while no ring
                   closure joined two fragments, see xfrag) */
} bondrec;

typedef struct {
    int pos;      /* byte offset of the atom token */
    int len;      /* token length */
    int maxval;   /* max valence (unbracketed organic subset), 0 = unchecked */
    int aromatic; /* lowercase symbol */
    int oxygen;   /* O, o, or a bracket O ([O-], [18OH], ...) */
    int nitrogen; /* N, n, or a bracket N */
    int maxval_o; /* max valence with a multiple bond to O (or, for N, to N):
                     RDKit's clean-up accepts nitro / N-oxide / azide /
                     diazonium N up to 5 and perhalic X(=O)(=O)(=O)O up to 7 */
    int val2;     /* twice the bond orders so far, ring bonds once closed */
    int dbl_o;    /* has a multiple bond to O (N: or to N) */
    /* the masks' running counts (levels SYNTAX and VALENCE): */
    int res2;   /* twice the orders of the ring bonds opened here, not closed yet */
    int deg;    /* neighbours so far, open ring bonds and explicit H included */
    int limit2; /* VALENCE: twice the largest valence incl. H, NOLIMIT = unchecked */
    int maxdeg; /* VALENCE: most neighbours (aromatic atoms: 3), 0 = unchecked */
    int h2;     /* twice the bracket H count */
    int parent; /* the atom it bonded to when it came (-1: first of a fragment) */
    int pbond;  /* the bond to parent (-1: none) */
    int depth;  /* atoms above it through parent */
    int cyc;    /* on a cycle of the bonds so far (tree paths of the closures) */
    char sym;   /* aromatic atoms: c n o s p b unbracketed, 'x' bracket (z below) */
    int z;      /* bracket atoms: atomic number */
    int q;      /* bracket atoms: charge */
} atomrec;

/* Unbracketed aliphatic organic-subset atoms: the largest valence RDKit
 * 2022.09 accepts for a neutral atom written without brackets. */
static int organic_maxval(const char *t, int len) {
    if (len == 2) return t[0] == 'C' ? 1 /* Cl */ : 1 /* Br */;
    switch (t[0]) {
    case 'B': return 3;
    case 'C': return 4;
    case 'N': return 3;
    case 'O': return 2;
    case 'S': return 6;
    case 'P': return 7;
    case 'F': return 1;
    case 'I': return 5;
    default: return 0; /* '*' */
    }
}

static int bond_order2(char sym) {
    switch (sym) {
    case '=': return 4;
    case '#': return 6;
    case '$': return 8;
    case '-':
    case '/':
    case '\\': return 2;
    case ':': return 0; /* RDKit accepts "CS:Clc1ccccc1": count nothing */
    default: return 2;  /* implicit: single, or aromatic (>= 1) */
    }
}

/* Atoms on a cycle: those with an incident bond that is not a bridge
 * (iterative Tarjan low-link; the graph has no parallel edges). Sets
 * inring[a] = 1, and bcyc[e] = 1 for the bonds on a cycle when bcyc is not
 * NULL. Returns 0, or -1 on out-of-memory. */
static int ring_atoms(int natoms, const bondrec *bonds, int nbonds, unsigned char *inring,
                      unsigned char *bcyc) {
    int *deg = calloc((size_t)natoms + 1, sizeof *deg);
    int *adj = malloc(((size_t)nbonds * 2 + 1) * sizeof *adj); /* edge ids */
    int *disc = malloc(((size_t)natoms + 1) * sizeof *disc);
    int *low = malloc(((size_t)natoms + 1) * sizeof *low);
    int *pedge = malloc(((size_t)natoms + 1) * sizeof *pedge);
    int *iter = malloc(((size_t)natoms + 1) * sizeof *iter);
    int *stk = malloc(((size_t)natoms + 1) * sizeof *stk);
    int rc = 0;
    if (!deg || !adj || !disc || !low || !pedge || !iter || !stk) {
        rc = -1;
        goto out;
    }
    for (int e = 0; e < nbonds; e++) {
        deg[bonds[e].a + 1]++;
        deg[bonds[e].b + 1]++;
    }
    for (int a = 0; a < natoms; a++) deg[a + 1] += deg[a]; /* deg[a] = start of a's edges */
    for (int a = 0; a < natoms; a++) iter[a] = deg[a];
    for (int e = 0; e < nbonds; e++) {
        adj[iter[bonds[e].a]++] = e;
        adj[iter[bonds[e].b]++] = e;
    }
    for (int a = 0; a < natoms; a++) {
        disc[a] = -1;
        iter[a] = deg[a];
    }
    int time = 0;
    for (int r = 0; r < natoms; r++) {
        if (disc[r] >= 0) continue;
        int top = 0;
        stk[top++] = r;
        disc[r] = low[r] = time++;
        pedge[r] = -1;
        while (top > 0) {
            int u = stk[top - 1];
            if (iter[u] < deg[u + 1]) {
                int e = adj[iter[u]++];
                if (e == pedge[u]) continue;
                int v = bonds[e].a == u ? bonds[e].b : bonds[e].a;
                if (disc[v] < 0) {
                    disc[v] = low[v] = time++;
                    pedge[v] = e;
                    stk[top++] = v;
                } else {
                    if (bcyc) bcyc[e] = 1; /* back edge: on a cycle */
                    if (disc[v] < low[u]) low[u] = disc[v];
                }
            } else {
                top--;
                if (pedge[u] >= 0) {
                    int e = pedge[u];
                    int p = bonds[e].a == u ? bonds[e].b : bonds[e].a;
                    if (low[u] < low[p]) low[p] = low[u];
                    if (low[u] <= disc[p]) { /* tree edge p-u is not a bridge */
                        inring[u] = 1;
                        inring[p] = 1;
                        if (bcyc) bcyc[e] = 1;
                    }
                }
            }
        }
    }
    /* a back edge u-v (v an ancestor) gives low[u] <= disc[v], so every tree
     * edge on the path v..u is marked: all of that cycle's atoms */
out:
    free(deg);
    free(adj);
    free(disc);
    free(low);
    free(pedge);
    free(iter);
    free(stk);
    return rc;
}

/* ------------------------------------------------------------ the parser */

struct mg_smiles_state {
    mg_constrain level;
    int cap; /* atoms, bonds and branch depth it can hold (one per token at most) */
    int pos; /* bytes consumed: positions in messages */
    int ntok;
    int prev;
    int cur; /* the atom new atoms / ring bonds attach to */
    int sp, natoms, nbonds, nring_open;
    int bond_after_open; /* the pending bond came right after '(' */
    int xfrag;           /* a ring closure joined two fragments (C1.C1): the
                            parent tree no longer spans, bonds' cyc is a lower bound */
    char bsym;           /* pending bond symbol, 0 = implicit */
    int ring_atom[100], ring_pos[100];
    char ring_sym[100];
    int *stack; /* branch points */
    bondrec *bonds;
    atomrec *atoms;
    unsigned char *inring; /* scratch of the end check and of viable */
    int *kwork;            /* scratch of kekule_ok: 3 (natoms + 1) + 2 nbonds <= 6 (cap + 1) ints */
    unsigned char *bwork;  /* scratch of kekule_ok: a flag per bond (cap + 1) */
    const char *src;       /* the whole string when known: atoms named in messages */
};

const char *mg_constrain_name(mg_constrain c) {
    switch (c) {
    case MG_CONSTRAIN_NONE: return "none";
    case MG_CONSTRAIN_SYNTAX: return "syntax";
    case MG_CONSTRAIN_VALENCE: return "valence";
    }
    return "?";
}

int mg_constrain_parse(const char *s, mg_constrain *out) {
    for (int c = MG_CONSTRAIN_NONE; c <= MG_CONSTRAIN_VALENCE; c++)
        if (s && !strcmp(s, mg_constrain_name((mg_constrain)c))) {
            *out = (mg_constrain)c;
            return 1;
        }
    return 0;
}

mg_status mg_smiles_state_new(int cap, mg_constrain level, mg_smiles_state **out, mg_error *err) {
    if (!out) return mg_fail(err, MG_ERR_ARG, "smiles state: out is NULL");
    *out = NULL;
    if (cap < 1 || cap > (1 << 24))
        return mg_fail(err, MG_ERR_ARG, "smiles state: capacity %d outside [1, 2^24]", cap);
    if (level < MG_CONSTRAIN_NONE || level > MG_CONSTRAIN_VALENCE)
        return mg_fail(err, MG_ERR_ARG, "smiles state: unknown level %d", (int)level);
    mg_smiles_state *s = calloc(1, sizeof *s);
    if (s) {
        s->stack = malloc((size_t)(cap + 1) * sizeof *s->stack);
        s->bonds = malloc((size_t)(cap + 1) * sizeof *s->bonds);
        s->atoms = malloc((size_t)(cap + 1) * sizeof *s->atoms);
        s->inring = malloc((size_t)cap + 1);
        s->kwork = malloc((size_t)(cap + 1) * 6 * sizeof *s->kwork);
        s->bwork = malloc((size_t)cap + 1);
    }
    if (!s || !s->stack || !s->bonds || !s->atoms || !s->inring || !s->kwork || !s->bwork) {
        mg_smiles_state_free(s);
        return mg_fail(err, MG_ERR_NOMEM, "smiles state: out of memory for %d tokens", cap);
    }
    s->cap = cap;
    s->level = level;
    mg_smiles_state_reset(s);
    *out = s;
    return 0;
}

void mg_smiles_state_free(mg_smiles_state *s) {
    if (!s) return;
    free(s->stack);
    free(s->bonds);
    free(s->atoms);
    free(s->inring);
    free(s->kwork);
    free(s->bwork);
    free(s);
}

void mg_smiles_state_reset(mg_smiles_state *s) {
    s->pos = s->ntok = 0;
    s->prev = P_NONE;
    s->cur = -1;
    s->sp = s->natoms = s->nbonds = s->nring_open = 0;
    s->bond_after_open = 0;
    s->xfrag = 0;
    s->bsym = 0;
    s->src = NULL;
    for (int d = 0; d < 100; d++) s->ring_atom[d] = -1;
}

void mg_smiles_state_copy(mg_smiles_state *dst, const mg_smiles_state *src) {
    int *stack = dst->stack;
    bondrec *bonds = dst->bonds;
    atomrec *atoms = dst->atoms;
    unsigned char *inring = dst->inring;
    int *kwork = dst->kwork;
    unsigned char *bwork = dst->bwork;
    const int cap = dst->cap;
    memcpy(dst, src, sizeof *dst);
    dst->stack = stack;
    dst->bonds = bonds;
    dst->atoms = atoms;
    dst->inring = inring;
    dst->kwork = kwork;
    dst->bwork = bwork;
    dst->cap = cap;
    memcpy(stack, src->stack, (size_t)src->sp * sizeof *stack);
    memcpy(bonds, src->bonds, (size_t)src->nbonds * sizeof *bonds);
    memcpy(atoms, src->atoms, (size_t)src->natoms * sizeof *atoms);
}

int mg_smiles_state_tokens(const mg_smiles_state *s) { return s ? s->ntok : 0; }

/* Twice the order a bond symbol stands for at this level: ':' counts nothing
 * for the post-hoc lower bound, as single for VALENCE. */
static int order2_at(const mg_smiles_state *s, char sym) {
    if (sym == ':' && s->level == MG_CONSTRAIN_VALENCE) return 2;
    return bond_order2(sym);
}

/* RDKit 2022.09's periodic table (Chem.GetPeriodicTable(), generated from
 * it): default valence, outer electrons, and the n allowed valences of the
 * neutral element (vl[n - 1] = -1: any valence above; 0: the noble gases,
 * unchecked as well). New vocabulary tokens (molgen train --extend-vocab)
 * get their valences here. */
typedef struct {
    signed char dv, nouter, n, vl[4];
} elem_valence;
static const elem_valence k_valence[118] = {
    {1, 1, 1, {1, 0, 0, 0}}, /* 1 H */
    {0, 2, 1, {0, 0, 0, 0}}, /* 2 He */
    {1, 1, 1, {1, 0, 0, 0}}, /* 3 Li */
    {2, 2, 1, {2, 0, 0, 0}}, /* 4 Be */
    {3, 3, 1, {3, 0, 0, 0}}, /* 5 B */
    {4, 4, 1, {4, 0, 0, 0}}, /* 6 C */
    {3, 5, 1, {3, 0, 0, 0}}, /* 7 N */
    {2, 6, 1, {2, 0, 0, 0}}, /* 8 O */
    {1, 7, 1, {1, 0, 0, 0}}, /* 9 F */
    {0, 8, 1, {0, 0, 0, 0}}, /* 10 Ne */
    {1, 1, 1, {1, 0, 0, 0}}, /* 11 Na */
    {2, 2, 2, {2, -1, 0, 0}}, /* 12 Mg */
    {3, 3, 2, {3, 6, 0, 0}}, /* 13 Al */
    {4, 4, 2, {4, 6, 0, 0}}, /* 14 Si */
    {3, 5, 3, {3, 5, 7, 0}}, /* 15 P */
    {2, 6, 3, {2, 4, 6, 0}}, /* 16 S */
    {1, 7, 1, {1, 0, 0, 0}}, /* 17 Cl */
    {0, 8, 1, {0, 0, 0, 0}}, /* 18 Ar */
    {1, 1, 1, {1, 0, 0, 0}}, /* 19 K */
    {2, 2, 2, {2, -1, 0, 0}}, /* 20 Ca */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 21 Sc */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 22 Ti */
    {-1, 5, 1, {-1, 0, 0, 0}}, /* 23 V */
    {-1, 6, 1, {-1, 0, 0, 0}}, /* 24 Cr */
    {-1, 7, 1, {-1, 0, 0, 0}}, /* 25 Mn */
    {-1, 8, 1, {-1, 0, 0, 0}}, /* 26 Fe */
    {-1, 9, 1, {-1, 0, 0, 0}}, /* 27 Co */
    {-1, 10, 1, {-1, 0, 0, 0}}, /* 28 Ni */
    {-1, 11, 1, {-1, 0, 0, 0}}, /* 29 Cu */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 30 Zn */
    {3, 3, 1, {3, 0, 0, 0}}, /* 31 Ga */
    {4, 4, 1, {4, 0, 0, 0}}, /* 32 Ge */
    {3, 5, 3, {3, 5, 7, 0}}, /* 33 As */
    {2, 6, 3, {2, 4, 6, 0}}, /* 34 Se */
    {1, 7, 1, {1, 0, 0, 0}}, /* 35 Br */
    {0, 8, 1, {0, 0, 0, 0}}, /* 36 Kr */
    {1, 1, 1, {1, 0, 0, 0}}, /* 37 Rb */
    {2, 2, 2, {2, -1, 0, 0}}, /* 38 Sr */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 39 Y */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 40 Zr */
    {-1, 5, 1, {-1, 0, 0, 0}}, /* 41 Nb */
    {-1, 6, 1, {-1, 0, 0, 0}}, /* 42 Mo */
    {-1, 7, 1, {-1, 0, 0, 0}}, /* 43 Tc */
    {-1, 8, 1, {-1, 0, 0, 0}}, /* 44 Ru */
    {-1, 9, 1, {-1, 0, 0, 0}}, /* 45 Rh */
    {-1, 10, 1, {-1, 0, 0, 0}}, /* 46 Pd */
    {-1, 11, 1, {-1, 0, 0, 0}}, /* 47 Ag */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 48 Cd */
    {3, 3, 1, {3, 0, 0, 0}}, /* 49 In */
    {2, 4, 2, {2, 4, 0, 0}}, /* 50 Sn */
    {3, 5, 3, {3, 5, 7, 0}}, /* 51 Sb */
    {2, 6, 3, {2, 4, 6, 0}}, /* 52 Te */
    {1, 7, 3, {1, 3, 5, 0}}, /* 53 I */
    {0, 8, 4, {0, 2, 4, 6}}, /* 54 Xe */
    {1, 1, 1, {1, 0, 0, 0}}, /* 55 Cs */
    {2, 2, 2, {2, -1, 0, 0}}, /* 56 Ba */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 57 La */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 58 Ce */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 59 Pr */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 60 Nd */
    {-1, 5, 1, {-1, 0, 0, 0}}, /* 61 Pm */
    {-1, 6, 1, {-1, 0, 0, 0}}, /* 62 Sm */
    {-1, 7, 1, {-1, 0, 0, 0}}, /* 63 Eu */
    {-1, 8, 1, {-1, 0, 0, 0}}, /* 64 Gd */
    {-1, 9, 1, {-1, 0, 0, 0}}, /* 65 Tb */
    {-1, 10, 1, {-1, 0, 0, 0}}, /* 66 Dy */
    {-1, 11, 1, {-1, 0, 0, 0}}, /* 67 Ho */
    {-1, 12, 1, {-1, 0, 0, 0}}, /* 68 Er */
    {-1, 13, 1, {-1, 0, 0, 0}}, /* 69 Tm */
    {-1, 14, 1, {-1, 0, 0, 0}}, /* 70 Yb */
    {-1, 15, 1, {-1, 0, 0, 0}}, /* 71 Lu */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 72 Hf */
    {-1, 5, 1, {-1, 0, 0, 0}}, /* 73 Ta */
    {-1, 6, 1, {-1, 0, 0, 0}}, /* 74 W */
    {-1, 7, 1, {-1, 0, 0, 0}}, /* 75 Re */
    {-1, 8, 1, {-1, 0, 0, 0}}, /* 76 Os */
    {-1, 9, 1, {-1, 0, 0, 0}}, /* 77 Ir */
    {-1, 10, 1, {-1, 0, 0, 0}}, /* 78 Pt */
    {-1, 11, 1, {-1, 0, 0, 0}}, /* 79 Au */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 80 Hg */
    {3, 3, 1, {3, 0, 0, 0}}, /* 81 Tl */
    {2, 4, 2, {2, 4, 0, 0}}, /* 82 Pb */
    {3, 5, 3, {3, 5, 7, 0}}, /* 83 Bi */
    {2, 6, 3, {2, 4, 6, 0}}, /* 84 Po */
    {1, 7, 3, {1, 3, 5, 0}}, /* 85 At */
    {0, 8, 1, {0, 0, 0, 0}}, /* 86 Rn */
    {1, 1, 1, {1, 0, 0, 0}}, /* 87 Fr */
    {2, 2, 2, {2, -1, 0, 0}}, /* 88 Ra */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 89 Ac */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 90 Th */
    {-1, 3, 1, {-1, 0, 0, 0}}, /* 91 Pa */
    {-1, 4, 1, {-1, 0, 0, 0}}, /* 92 U */
    {-1, 5, 1, {-1, 0, 0, 0}}, /* 93 Np */
    {-1, 6, 1, {-1, 0, 0, 0}}, /* 94 Pu */
    {-1, 7, 1, {-1, 0, 0, 0}}, /* 95 Am */
    {-1, 8, 1, {-1, 0, 0, 0}}, /* 96 Cm */
    {-1, 9, 1, {-1, 0, 0, 0}}, /* 97 Bk */
    {-1, 10, 1, {-1, 0, 0, 0}}, /* 98 Cf */
    {-1, 11, 1, {-1, 0, 0, 0}}, /* 99 Es */
    {-1, 12, 1, {-1, 0, 0, 0}}, /* 100 Fm */
    {-1, 13, 1, {-1, 0, 0, 0}}, /* 101 Md */
    {-1, 14, 1, {-1, 0, 0, 0}}, /* 102 No */
    {-1, 15, 1, {-1, 0, 0, 0}}, /* 103 Lr */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 104 Rf */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 105 Db */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 106 Sg */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 107 Bh */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 108 Hs */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 109 Mt */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 110 Ds */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 111 Rg */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 112 Cn */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 113 Nh */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 114 Fl */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 115 Mc */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 116 Lv */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 117 Ts */
    {-1, 2, 1, {-1, 0, 0, 0}}, /* 118 Og */
};

#define NOLIMIT (1 << 20) /* limit2: unchecked */

/* Twice the largest valence (bonds and H) RDKit 2022.09's sanitisation lets a
 * bracket atom of element z (1..118) and charge q have. Its rule: with m the
 * element's largest valence, the valence minus q (elements with >= 4 outer
 * electrons) or plus q (the others) must not exceed m: N+ 4 (as C), O- 1
 * (as F), O+ 3, N- 2, S- 5, B- 4, C- 3, Cl+ 2, Na+ 0; H+ takes 1. A
 * negative limit ([O+3]) refuses the atom itself. NOLIMIT where RDKit
 * checks nothing (transition metals, noble gases). Checked for every
 * element and charge -3..3 against RDKit (test_smiles_rdkit.py). */
static int rdkit_limit2(int z, int q) {
    if (z < 1 || z > 118) return NOLIMIT;
    const elem_valence *e = &k_valence[z - 1];
    const int m = e->vl[e->n - 1];
    if (m <= 0) return NOLIMIT;
    if (z == 1 && q > 0) return 2;
    return 2 * (e->nouter >= 4 ? m + q : m - q);
}

/* Twice the valence RDKit's kekulisation wants of an aromatic bracket atom
 * (z, charge q) with twice-bond-sum v2 (aromatic bonds as single, H
 * included), or -1 when it cannot be known yet: its default valence plus
 * the charge (minus for elements with < 4 outer electrons: [b-] as c; C+
 * as C-), the next allowed valence when the bonds exceed it (S, Se, Te
 * with three bonds: 4). */
static int kekule_dv2(int z, int q, int v2) {
    if (z < 1 || z > 118) return -1;
    const elem_valence *e = &k_valence[z - 1];
    int c = e->nouter < 4 ? -q : q;
    if (z == 6 && c > 0) c = -c;
    const int dv2 = 2 * (e->dv + c);
    if (e->n == 1 || v2 <= dv2) return e->dv > 0 ? dv2 : -1;
    if (q == 0 && (z == 16 || z == 34 || z == 52)) return v2 == 6 ? 8 : -1;
    return -1;
}

/* VALENCE limits of a new atom (twice the valence and the neighbour count).
 * Bracket atoms: the valence of the isoelectronic neutral element (N+ as C,
 * O- as F, C- as N, S+ as P: RDKit's rule for charged atoms), explicit H
 * included. Aromatic atoms: bonds inside the ring count as single, so c may
 * carry one more single (or one exocyclic double: pyridone's C=O), n one
 * more single (pyrrole's N-R); at most 3 neighbours. */
static void valence_limits(atomrec *a, const char *t, const bracket_info *bi) {
    a->limit2 = NOLIMIT;
    a->maxdeg = a->h2 = 0;
    a->q = 0;
    if (t[0] == '[') {
        if (bi->z) a->limit2 = rdkit_limit2(bi->z, bi->charge);
        a->h2 = 2 * bi->hcount;
        a->deg = bi->hcount;
        a->q = bi->charge;
    } else if (a->aromatic) {
        switch (t[0]) {
        case 'c': a->limit2 = 8; break;
        case 'n': a->limit2 = 6; break;
        case 'o': a->limit2 = 4; break;
        case 's': a->limit2 = 8; break;
        case 'p': a->limit2 = 6; break;
        case 'b': a->limit2 = 6; break;
        default: break;
        }
    } /* unbracketed aliphatic atoms: maxval / maxval_o, as SYNTAX */
    if (a->aromatic) a->maxdeg = 3;
}

/* The mask's valence rule for atom a (levels SYNTAX and VALENCE): its bonds,
 * the ring bonds it opened and `extra` (twice a bond about to be made) must
 * fit. SYNTAX: the post-hoc bound of unbracketed aliphatic atoms, with the
 * raised limit only once the multiple bond to O is there. VALENCE: also
 * the limits of valence_limits. */
static int fits(const mg_smiles_state *s, const atomrec *a, int extra, int extra_deg) {
    if (s->level == MG_CONSTRAIN_NONE) return 1;
    const int v = a->val2 + a->res2 + extra;
    /* VALENCE keeps N at 3 and halogens at 1 even with a multiple bond to O:
     * RDKit's clean-up charges N(=O)=O and X(=O)(=O)(=O)O but refuses the
     * valences between (C-N(=O)-C: "Explicit valence for atom N, 4") */
    const int mv = a->dbl_o && s->level != MG_CONSTRAIN_VALENCE ? a->maxval_o : a->maxval;
    if (mv && v > 2 * mv) return 0;
    if (s->level == MG_CONSTRAIN_VALENCE) {
        if (v + a->h2 > a->limit2) return 0;
        if (a->maxdeg && a->deg + extra_deg > a->maxdeg) return 0;
    }
    return 1;
}

/* A bond written with symbol sym (0: none) is aromatic between aromatic
 * atoms: none, ':', and '/' '\\' (RDKit reads them so); '-' is single. */
static int arom_sym(char sym) { return !sym || sym == ':' || sym == '/' || sym == '\\'; }

/* A bond of twice-order o2 between atoms x and y (arom: written with no
 * symbol, ':', '/' or '\\': aromatic between aromatic atoms, as RDKit reads
 * them); returns its index. */
static int add_bond(mg_smiles_state *s, int x, int y, int o2, int arom) {
    s->bonds[s->nbonds].a = x;
    s->bonds[s->nbonds].b = y;
    s->bonds[s->nbonds].order2 = o2;
    s->bonds[s->nbonds].arom = arom;
    s->bonds[s->nbonds].cyc = 0;
    s->nbonds++;
    atomrec *ax = &s->atoms[x], *ay = &s->atoms[y];
    ax->val2 += o2;
    ay->val2 += o2;
    ax->deg++;
    ay->deg++;
    if (o2 >= 4) {
        ax->dbl_o |= ay->oxygen || (ax->nitrogen && ay->nitrogen);
        ay->dbl_o |= ax->oxygen || (ax->nitrogen && ay->nitrogen);
    }
    return s->nbonds - 1;
}

/* Marks the atoms on the tree path between atoms u and v (through parent;
 * nothing when they are in different fragments): m[z] = 1, or with m NULL
 * their cyc flags and those of the path's bonds; with bm, bm[b] = 1 for the
 * path's bonds b (and no atom marks when m is NULL too). Returns 0 when u
 * and v are in different fragments, else 1. */
static int mark_path(mg_smiles_state *s, int u, int v, unsigned char *m, unsigned char *bm) {
    int x = u, y = v;
    while (x >= 0 && y >= 0 && x != y) {
        if (s->atoms[x].depth >= s->atoms[y].depth)
            x = s->atoms[x].parent;
        else
            y = s->atoms[y].parent;
    }
    if (x < 0 || y < 0) return 0;
    for (int pass = 0; pass < 2; pass++)
        for (int z = pass ? v : u;; z = s->atoms[z].parent) {
            if (m)
                m[z] = 1;
            else if (!bm)
                s->atoms[z].cyc = 1;
            if (z == x) break;
            /* the bond z - parent(z) is on the path */
            if (bm)
                bm[s->atoms[z].pbond] = 1;
            else if (!m)
                s->bonds[s->atoms[z].pbond].cyc = 1;
        }
    return 1;
}

/* The ring digits open now, ascending, into d [100]; returns how many. The
 * checks below loop over these instead of all 100 digits (per atom, per
 * candidate token: the mask's inner loops). */
static int open_rings(const mg_smiles_state *s, int *d) {
    int k = 0;
    for (int i = 0; i < 100 && k < s->nring_open; i++)
        if (s->ring_atom[i] >= 0) d[k++] = i;
    return k;
}

/* Aromatic atoms not on a cycle yet. */
static int pending_aromatic(const mg_smiles_state *s) {
    int k = 0;
    for (int a = 0; a < s->natoms; a++) k += s->atoms[a].aromatic && !s->atoms[a].cyc;
    return k;
}

/* ------------------------------------------------------------ Kekulé
 * VALENCE: can the aromatic atoms still get alternating bonds, as RDKit's
 * kekulisation needs? Each aromatic atom is one of
 *   MUST  it needs exactly one double bond to an aromatic neighbour: c with
 *         no double bond yet; n, p, b (or a bracket atom) with one bond's
 *         worth of valence left (pyridine's n, phosphinine's p, [nH+],
 *         [o+], [cH]);
 *   OUT   it can take none: n with three neighbours, [nH], o, s (RDKit's
 *         valence 2 for them), [n-], [cH-], an atom that has its double
 *         bond (pyridone's c=O);
 *   MAY   either: p with three bonds (P(V)), se, te, a bracket atom of
 *         several valences or with more room (permissive: never a reason
 *         to refuse);
 * and the question is whether the aromatic bonds (written without a symbol,
 * with ':' or with '/' '\') on a cycle (kk_cyclic: RDKit makes no bridge
 * double; while the string is written, also those a later ring closure can
 * still put on one) between non-OUT atoms hold a matching that covers every MUST
 * atom. An explicit '-' is single (RDKit keeps it so), also when it is
 * still pending after cur. With future = 1 (a string still being written)
 * a MUST atom that new bonds can still reach (cur or a branch point with
 * room, or holding an open ring bond) counts as MAY where one more bond
 * could be its double one or take its need away; the bonds an atom is
 * committed to (a bond symbol or '(' after it, its open ring bonds, open
 * rings only cur can close) count as made; an atom with fewer than two
 * bonds will get them (it must end on a ring). Backtracking
 * over the MUST atoms in order; past a budget of steps the answer is yes
 * (permissive). Returns 1 if a matching may exist, 0 if none can. */
enum { K_OUT = 0, K_MUST = 1, K_MAY = 2 };
#define MG_KK_ACTIVE 256 /* atoms new bonds can reach that kk_cyclic follows */

typedef struct {
    const unsigned char *role;
    int *match, *adj, *start;
    int n;
    long budget;
} kk_search;

static int kk_solve(kk_search *k, int from) {
    int u = -1;
    for (int a = from; a < k->n && u < 0; a++)
        if (k->role[a] == K_MUST && k->match[a] < 0) u = a;
    if (u < 0) return 1;
    if (--k->budget < 0) return 1;
    for (int e = k->start[u]; e < k->start[u + 1]; e++) {
        const int v = k->adj[e];
        if (k->match[v] >= 0) continue;
        k->match[u] = v;
        k->match[v] = u;
        if (kk_solve(k, u + 1)) return 1;
        k->match[u] = k->match[v] = -1;
    }
    return 0;
}

/* Twice the valence atom a has left with val2 of bonds (bracket H
 * included), and whether that is known: unbracketed c n o, and bracket
 * atoms of one valence with a limit. */
static int kk_rem2(const atomrec *r, int val2, int *known) {
    *known = 1;
    switch (r->sym) {
    case 'c': return 8 - val2;
    case 'n':
    case 'p':
    case 'b': return 6 - val2; /* valence 3 (p: also 5, see kk_role) */
    case 'o': return 4 - val2; /* valence 2: furan's o takes no double bond */
    case 's': /* valence 2: thiophene's s takes none; with three bonds RDKit
                 moves it to valence 4 and it needs one (c1ccs(C)cc1) */
        return val2 == 6 ? 2 : 4 - val2;
    case 'x': {
        const int dv2 = kekule_dv2(r->z, r->q, val2 + r->h2);
        if (dv2 >= 0) return dv2 - val2 - r->h2;
        break;
    }
    default: break;
    }
    *known = 0;
    return 0;
}

/* Atom a's role. Bonds it is committed to but that are not made yet (a
 * bond symbol or '(' after cur, the ring bonds it opened) count as single
 * ones; committed_arom: one of them may still be its double bond (no symbol
 * or ':'). reach: an atom later tokens can bond again (cur, a branch point)
 * with room for one more bond. */
static int kk_role(const atomrec *r, int has_double, int val2, int committed_arom, int reach) {
    if (has_double) return K_OUT;
    int known;
    const int rem2 = kk_rem2(r, val2, &known);
    int role;
    if (r->sym == 'c')
        role = K_MUST; /* c always needs one: its H fills the rest */
    else if (!known)
        return K_MAY;
    else if (r->sym == 'p' && rem2 <= 0)
        return K_MAY; /* P(V) may still take one */
    else
        /* a bracket atom takes no implicit H, so RDKit wants a double
         * bond of it with two bonds' worth missing as well ([n+] with two
         * neighbours): one is as close as it gets */
        role = rem2 == 2 || (rem2 == 4 && r->sym == 'x') ? K_MUST : rem2 <= 0 ? K_OUT : K_MAY;
    if (role != K_MUST) return role;
    if (committed_arom && rem2 >= 2) return K_MAY; /* that bond may be the double one */
    /* a later bond may be the double one (room for 2), or, but for c, one
     * more single bond takes away the need (n with three bonds is
     * pyrrole's) */
    if (reach && (rem2 >= 4 || r->sym != 'c')) return K_MAY;
    return K_MUST;
}

/* Which bonds may be double in the kekulisation, into cand[nbonds]: RDKit
 * makes no bridge double (c1cc(=O)ccc1c1cc(=O)ccc1 is refused), so only the
 * bonds on a cycle; with future, also those that a later ring closure can
 * still put on one: the tree paths between the atoms new bonds can reach
 * (cur, the branch points, the atoms holding open ring bonds). Returns 0,
 * or -1 when out of memory. */
static int kk_cyclic(mg_smiles_state *s, int future, unsigned char *cand) {
    const int nb = s->nbonds;
    if (s->xfrag) { /* the parent tree does not span: exact at the end only */
        if (future) {
            memset(cand, 1, (size_t)nb);
            return 0;
        }
        memset(cand, 0, (size_t)nb);
        return ring_atoms(s->natoms, s->bonds, nb, s->inring, cand);
    }
    int open = 0;
    for (int k = 0; k < nb; k++) {
        cand[k] = (unsigned char)s->bonds[k].cyc;
        open |= !cand[k] && s->bonds[k].arom && s->bonds[k].order2 == 2 &&
                s->atoms[s->bonds[k].a].aromatic && s->atoms[s->bonds[k].b].aromatic;
    }
    if (!future || !open) return 0;
    int act[MG_KK_ACTIVE], na = 0, od[100];
    const int nod = open_rings(s, od);
    if (s->cur >= 0 && s->prev != P_DOT) act[na++] = s->cur;
    for (int k = 0; k < s->sp && na < MG_KK_ACTIVE; k++) act[na++] = s->stack[k];
    for (int q = 0; q < nod && na < MG_KK_ACTIVE; q++) act[na++] = s->ring_atom[od[q]];
    if (na >= MG_KK_ACTIVE) { /* more than the mask ever sees: permissive */
        memset(cand, 1, (size_t)nb);
        return 0;
    }
    /* the union of the paths between them: per fragment, the paths from
     * each to the first of them in its fragment (a tree's Steiner tree) */
    for (int i = 1; i < na; i++)
        for (int j = 0; j < i; j++)
            if (mark_path(s, act[i], act[j], NULL, cand)) break;
    return 0;
}

static int kekule_ok(mg_smiles_state *s, int future) {
    if (s->level != MG_CONSTRAIN_VALENCE || s->natoms == 0) return 1;
    const int n = s->natoms;
    unsigned char *cand = s->bwork;
    if (kk_cyclic(s, future, cand) != 0) return 1; /* out of memory: permissive */
    unsigned char *role = s->inring;
    int *match = s->kwork, *start = match + (n + 1), *fill = start + (n + 1),
        *adj = fill + (n + 1); /* adj: 2 per bond */
    int any_must = 0;
    memset(role, 0, (size_t)n);
    for (int a = 0; a < n; a++) match[a] = 0; /* has a double bond */
    for (int k = 0; k < s->nbonds; k++)
        if (s->bonds[k].order2 >= 4) match[s->bonds[k].a] = match[s->bonds[k].b] = 1;
    /* what cur is committed to: a bond symbol (a double one; a single one,
     * explicit or ':'), '(' or open rings that only it can close through
     * (a bond of any kind) */
    int pend2 = 0, pend_arom = 0;
    if (future && s->cur >= 0 && s->prev == P_BOND) {
        const int o2 = order2_at(s, s->bsym);
        if (o2 >= 4) match[s->cur] = 1;
        else pend2 = 2, pend_arom = arom_sym(s->bsym);
    } else if (future && s->cur >= 0 && s->prev == P_OPEN) {
        pend2 = 2, pend_arom = 1;
    } else if (future && s->cur >= 0 && s->prev != P_DOT && s->nring_open > 0) {
        /* open rings must close through a bond to cur unless a branch point
         * has room: then cur gets one more bond, of any kind */
        int other = 0;
        for (int k = 0; k < s->sp && !other; k++)
            other = s->stack[k] != s->cur && fits(s, &s->atoms[s->stack[k]], 2, 1);
        if (!other) pend2 = 2, pend_arom = 1;
    }
    int od[100];
    const int nod = future ? open_rings(s, od) : 0;
    for (int a = 0; a < n; a++) fill[a] = 0; /* bonds made */
    for (int k = 0; k < s->nbonds; k++) fill[s->bonds[k].a]++, fill[s->bonds[k].b]++;
    for (int a = 0; a < n; a++) {
        if (!s->atoms[a].aromatic) continue;
        int committed2 = 0, carom = 0, reach = 0;
        if (future) {
            int nb = fill[a];
            for (int q = 0; q < nod; q++)
                if (s->ring_atom[od[q]] == a) {
                    const int d = od[q];
                    const int o2 = order2_at(s, s->ring_sym[d]);
                    if (o2 >= 4) match[a] = 1;
                    committed2 += o2 >= 4 ? 0 : 2;
                    carom |= arom_sym(s->ring_sym[d]);
                    nb++;
                }
            const int is_cur = a == s->cur && s->prev != P_DOT;
            if (is_cur) committed2 += pend2, carom |= pend_arom, nb += pend2 > 0;
            /* on a ring, as it must end, it has two bonds at least */
            if (nb < 2) committed2 += 2 * (2 - nb);
            reach = is_cur;
            for (int k = 0; k < s->sp && !reach; k++) reach = s->stack[k] == a;
            /* fits counts the open ring bonds (res2) already */
            if (reach) reach = fits(s, &s->atoms[a], 2 + (is_cur ? pend2 : 0), 1 + (is_cur && pend2));
        }
        role[a] = (unsigned char)kk_role(&s->atoms[a], match[a], s->atoms[a].val2 + committed2,
                                         carom, reach);
        any_must |= role[a] == K_MUST;
    }
    if (!any_must) return 1;
    /* the candidate edges, aromatic single-order bonds between non-OUT
     * atoms, as adjacency lists: counted (pass 0), then filled (pass 1) */
    for (int a = 0; a <= n; a++) start[a] = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < s->nbonds; k++) {
            const bondrec *b = &s->bonds[k];
            if (b->order2 != 2 || !b->arom || !cand[k] || role[b->a] == K_OUT ||
                role[b->b] == K_OUT)
                continue;
            if (pass == 0) {
                start[b->a + 1]++;
                start[b->b + 1]++;
            } else {
                adj[fill[b->a]++] = b->b;
                adj[fill[b->b]++] = b->a;
            }
        }
        if (pass == 0) {
            for (int a = 0; a < n; a++) start[a + 1] += start[a];
            for (int a = 0; a < n; a++) fill[a] = start[a];
        }
    }
    for (int a = 0; a < n; a++) match[a] = -1;
    kk_search k = {role, match, adj, start, n, 20000};
    return kk_solve(&k, 0);
}

/* An atom token t[0..l) at position pos: its record, and the bond to the
 * atom before it. Returns 1, or 0 with why. */
static int push_atom(mg_smiles_state *s, const char *t, int l, int pos, char *why, size_t n) {
    const int mask = s->level != MG_CONSTRAIN_NONE;
    const char c = t[0];
    bracket_info bi = {0};
    if (c == '[' && !bracket_ok(t + 1, l - 2, pos, why, n, &bi)) return 0;
    atomrec *a = &s->atoms[s->natoms];
    memset(a, 0, sizeof *a);
    a->pos = pos;
    a->len = l;
    if (c == '[') {
        a->maxval = 0;
        a->aromatic = bi.aromatic;
        a->oxygen = bi.z == 8;
        a->nitrogen = bi.z == 7;
        a->sym = 'x';
        a->z = bi.z;
    } else {
        a->aromatic = c >= 'a' && c <= 'z';
        a->sym = c;
        /* RDKit is lenient with lowercase atoms ("Co1CCCCC1" and
         * "c1ccccc#1" parse), so only uppercase ones are checked */
        a->maxval = a->aromatic ? 0 : organic_maxval(t, l);
        a->oxygen = c == 'O' || c == 'o';
        a->nitrogen = c == 'N' || c == 'n';
    }
    a->maxval_o = a->maxval;
    if (c == 'N')
        a->maxval_o = 5;
    else if (l == 2 || c == 'I') /* Cl, Br, I */
        a->maxval_o = 7;
    if (s->level == MG_CONSTRAIN_VALENCE) valence_limits(a, t, &bi);
    int a_id = s->natoms++;
    a->parent = -1;
    a->pbond = -1;
    if (s->prev != P_NONE && s->prev != P_DOT) {
        a->parent = s->cur;
        a->depth = s->atoms[s->cur].depth + 1;
        const int o2 = order2_at(s, s->bsym);
        if (mask && (!fits(s, &s->atoms[s->cur], o2, 1) || !fits(s, a, o2, 1)))
            return reject(why, n, "position %d: %.*s: bond exceeds a valence", pos, l, t);
        a->pbond = add_bond(s, s->cur, a_id, o2, arom_sym(s->bsym));
        if (mask && (!fits(s, &s->atoms[s->cur], 0, 0) || !fits(s, a, 0, 0)))
            return reject(why, n, "position %d: %.*s: bond exceeds a valence", pos, l, t);
    } else if (mask && !fits(s, a, 0, 0)) {
        return reject(why, n, "position %d: %.*s: exceeds its valence", pos, l, t);
    }
    s->cur = a_id;
    s->prev = P_ATOM;
    s->bond_after_open = 0;
    s->bsym = 0;
    return 1;
}

/* A bond symbol c at position pos. */
static int push_bond(mg_smiles_state *s, char c, int pos, char *why, size_t n) {
    const int mask = s->level != MG_CONSTRAIN_NONE;
    if (s->prev == P_NONE)
        return reject(why, n, "position %d: starts with a bond '%c'", pos, c);
    if (s->prev == P_BOND) return reject(why, n, "position %d: two bonds in a row", pos);
    if (s->prev == P_DOT) return reject(why, n, "position %d: bond '%c' after '.'", pos, c);
    if (mask && !fits(s, &s->atoms[s->cur], order2_at(s, c), 1))
        return reject(why, n, "position %d: bond '%c' exceeds a valence", pos, c);
    s->bond_after_open = s->prev == P_OPEN;
    s->prev = P_BOND;
    s->bsym = c;
    return 1;
}

/* Ring label d opened at the current atom (its bond order reserved). */
static int ring_open(mg_smiles_state *s, int d, int pos, char *why, size_t n) {
    const int mask = s->level != MG_CONSTRAIN_NONE;
    atomrec *ac = &s->atoms[s->cur];
    const int o2 = order2_at(s, s->bsym);
    if (mask && !fits(s, ac, o2, 1))
        return reject(why, n, "position %d: ring bond %d exceeds a valence", pos, d);
    s->ring_atom[d] = s->cur;
    s->ring_pos[d] = pos;
    s->ring_sym[d] = s->bsym;
    s->nring_open++;
    ac->res2 += o2;
    ac->deg++;
    return 1;
}

/* Ring label d closed at the current atom: the bond to its opening atom. */
static int ring_close(mg_smiles_state *s, int d, int pos, char *why, size_t n) {
    const int mask = s->level != MG_CONSTRAIN_NONE;
    atomrec *ac = &s->atoms[s->cur];
    int partner = s->ring_atom[d];
    if (partner == s->cur)
        return reject(why, n, "position %d: ring closure %d closes on its own atom", pos,
                      d);
    for (int k = 0; k < s->nbonds; k++)
        if ((s->bonds[k].a == s->cur && s->bonds[k].b == partner) ||
            (s->bonds[k].a == partner && s->bonds[k].b == s->cur))
            return reject(
                why, n, "position %d: ring closure %d duplicates an existing bond", pos, d);
    const char sym_open = s->ring_sym[d];
    if (mask && s->bsym && sym_open && s->bsym != sym_open)
        return reject(why, n, "position %d: ring closure %d: bond '%c' disagrees with '%c'",
                      pos, d, s->bsym, sym_open);
    /* the bond symbol may be written at either end; when both
     * are written RDKit uses one of them: count the smaller */
    int o1 = order2_at(s, s->bsym);
    int o2 = order2_at(s, sym_open);
    int order2 = o1;
    if (!s->bsym)
        order2 = o2;
    else if (sym_open && o2 < o1)
        order2 = o2;
    atomrec *ap = &s->atoms[partner];
    ap->res2 -= o2; /* the opening end's reservation becomes the bond */
    ap->deg--;
    if (mask && (!fits(s, ac, order2, 1) || !fits(s, ap, order2, 1)))
        return reject(why, n, "position %d: ring bond %d exceeds a valence", pos, d);
    const int b = add_bond(s, s->cur, partner, order2,
                           arom_sym(s->bsym) && arom_sym(sym_open));
    if (mask) {
        if (mark_path(s, s->cur, partner, NULL, NULL))
            s->bonds[b].cyc = 1;
        else
            s->xfrag = 1; /* joins two fragments: a bridge for now */
    }
    if (mask && (!fits(s, ac, 0, 0) || !fits(s, ap, 0, 0)))
        return reject(why, n, "position %d: ring bond %d exceeds a valence", pos, d);
    s->ring_atom[d] = -1;
    s->nring_open--;
    return 1;
}

/* A ring-closure token t (a digit or %NN) at position pos. */
static int push_ring(mg_smiles_state *s, const char *t, int pos, char *why, size_t n) {
    const char c = t[0];
    int d = c == '%' ? (t[1] - '0') * 10 + (t[2] - '0') : c - '0';
    if (c == '%' && d < 10)
        return reject(why, n, "position %d: ring label '%.3s' (use a single digit)", pos, t);
    if (s->prev == P_NONE)
        return reject(why, n, "position %d: starts with ring closure %d", pos, d);
    if (s->prev == P_OPEN || s->prev == P_DOT || (s->prev == P_BOND && s->bond_after_open))
        return reject(why, n, "position %d: ring closure %d not after an atom", pos, d);
    if (!(s->ring_atom[d] < 0 ? ring_open(s, d, pos, why, n) : ring_close(s, d, pos, why, n)))
        return 0;
    s->prev = P_RING;
    s->bsym = 0;
    return 1;
}

int mg_smiles_state_push(mg_smiles_state *s, const char *t, int l, char *why, size_t n) {
    if (!s || !t || l < 1) return reject(why, n, "no token");
    if (s->ntok >= s->cap)
        return reject(why, n, "position %d: more than %d tokens", s->pos, s->cap);
    const int pos = s->pos;
    const int mask = s->level != MG_CONSTRAIN_NONE;
    char c = t[0];
    if (c == '[' || (l == 2 && (c == 'C' || c == 'B')) ||
        (l == 1 && strchr("BCNOSPFIbcnosp*", c))) {
        if (!push_atom(s, t, l, pos, why, n)) return 0;
    } else if (l == 1 && strchr("-=#$:/\\", c)) {
        if (!push_bond(s, c, pos, why, n)) return 0;
    } else if ((l == 1 && is_digit(c)) || (l == 3 && c == '%')) {
        if (!push_ring(s, t, pos, why, n)) return 0;
    } else if (l == 1 && c == '(') {
        if (s->prev != P_ATOM && s->prev != P_RING && s->prev != P_CLOSE)
            return reject(why, n, "position %d: '(' not after an atom", pos);
        if (mask && !fits(s, &s->atoms[s->cur], 2, 1))
            return reject(why, n, "position %d: a branch exceeds a valence", pos);
        s->stack[s->sp++] = s->cur;
        s->prev = P_OPEN;
    } else if (l == 1 && c == ')') {
        if (s->sp == 0) return reject(why, n, "position %d: ')' without '('", pos);
        if (s->prev == P_OPEN) return reject(why, n, "position %d: empty branch '()'", pos);
        if (s->prev == P_BOND) return reject(why, n, "position %d: bond before ')'", pos);
        s->cur = s->stack[--s->sp];
        s->prev = P_CLOSE;
    } else if (l == 1 && c == '.') {
        if (s->prev == P_NONE) return reject(why, n, "position %d: starts with '.'", pos);
        if (s->prev == P_BOND || s->prev == P_DOT || s->prev == P_OPEN)
            return reject(why, n, "position %d: '.' not after an atom", pos);
        s->prev = P_DOT;
    } else {
        return reject(why, n, "position %d: '%c' is not SMILES outside a bracket atom", pos, c);
    }
    s->pos += l;
    s->ntok++;
    return 1;
}

int mg_smiles_state_end(mg_smiles_state *s, char *why, size_t n) {
    const int pos = s->pos;
    if (s->ntok == 0) return reject(why, n, "empty string");
    if (s->prev == P_BOND) return reject(why, n, "position %d: ends with a bond", pos);
    if (s->prev == P_DOT) return reject(why, n, "position %d: ends with '.'", pos);
    if (s->sp > 0) return reject(why, n, "position %d: %d unclosed '('", pos, s->sp);
    if (s->nring_open > 0) {
        int first = -1;
        for (int d = 0; d < 100; d++)
            if (s->ring_atom[d] >= 0 && (first < 0 || s->ring_pos[d] < s->ring_pos[first]))
                first = d;
        return reject(why, n, "position %d: ring closure %d never closed", s->ring_pos[first],
                      first);
    }
    /* valence lower bound of unbracketed atoms */
    for (int a = 0; a < s->natoms; a++) {
        const atomrec *r = &s->atoms[a];
        int mv = r->dbl_o ? r->maxval_o : r->maxval;
        if (mv && r->val2 > 2 * mv)
            return reject(why, n, "position %d: %.*s has %d bonds' worth of valence, more than %d",
                          r->pos, s->src ? r->len : 4, s->src ? s->src + r->pos : "atom",
                          (r->val2 + 1) / 2, mv);
    }
    /* aromatic atoms must be on a ring */
    int any = 0;
    for (int a = 0; a < s->natoms; a++) any |= s->atoms[a].aromatic;
    if (any) {
        memset(s->inring, 0, (size_t)s->natoms);
        if (ring_atoms(s->natoms, s->bonds, s->nbonds, s->inring, NULL) != 0)
            return reject(why, n, "out of memory");
        for (int a = 0; a < s->natoms; a++)
            if (s->atoms[a].aromatic && !s->inring[a])
                return reject(why, n, "position %d: aromatic atom %.*s is not in a ring",
                              s->atoms[a].pos, s->src ? s->atoms[a].len : 0,
                              s->src ? s->src + s->atoms[a].pos : "");
    }
    return 1;
}

int mg_smiles_state_kekule(mg_smiles_state *s, int final) { return kekule_ok(s, !final); }

int mg_smiles_state_viable(mg_smiles_state *s) {
    if (s->cur < 0) return 1;
    /* after a bond symbol or '(' the next atom X bonds to cur: X is an
     * attach point with room, cur must keep room for that bond as well */
    const int pend = s->prev == P_BOND || s->prev == P_OPEN;
    const int pend2 = s->prev == P_BOND ? order2_at(s, s->bsym) : pend ? 2 : 0;
    const int cur_room = fits(s, &s->atoms[s->cur], pend2 + 2, pend + 1);
    if (s->nring_open > 0 && !pend && s->prev != P_DOT) {
        /* an open ring closes on a new atom chained to cur, or to an atom a
         * ')' gets back to: one of them needs room for a single bond */
        int room = cur_room;
        for (int k = 0; k < s->sp && !room; k++)
            room = s->stack[k] != s->cur && fits(s, &s->atoms[s->stack[k]], 2, 1);
        if (!room) return 0;
    }
    if (!pending_aromatic(s)) return 1;
    /* an aromatic atom off every cycle can still get on one only through the
     * atoms new bonds attach to (cur and the branch points, when they have
     * room for one more bond; X) and the open ring bonds: it must be one of
     * them or on the tree path from an open ring's atom to one of them */
    unsigned char *m = s->inring;
    memset(m, 0, (size_t)s->natoms);
    int od[100];
    const int nod = open_rings(s, od);
    for (int k = 0; k <= s->sp; k++) {
        const int a = k < s->sp ? s->stack[k] : s->cur;
        /* after '(' cur is the top of the stack too: its room is cur_room;
         * a new ring through a itself takes two bonds (the ring bond and the
         * way to its other end), one closing an open ring takes one */
        const int room = a == s->cur ? cur_room : fits(s, &s->atoms[a], 2, 1);
        const int room2 =
            a == s->cur ? fits(s, &s->atoms[a], pend2 + 4, pend + 2) : fits(s, &s->atoms[a], 4, 2);
        const int via_x = k == s->sp && pend; /* a ring bond at X passes through cur */
        if (room2) m[a] = 1;
        if (!room && !via_x) continue;
        for (int q = 0; q < nod; q++) mark_path(s, s->ring_atom[od[q]], a, m, NULL);
    }
    for (int a = 0; a < s->natoms; a++)
        if (s->atoms[a].aromatic && !s->atoms[a].cyc && !m[a]) return 0;
    return 1;
}

static int bonded(const mg_smiles_state *s, int x, int y) {
    for (int k = 0; k < s->nbonds; k++)
        if ((s->bonds[k].a == x && s->bonds[k].b == y) ||
            (s->bonds[k].a == y && s->bonds[k].b == x))
            return 1;
    return 0;
}

/* The shortest ending it knows: an atom after a bond, '(' or '.'; one ')' per
 * open branch; one digit per open ring, on cur when it may close them all
 * (distinct partners, none cur or bonded to it, room for the bonds), else
 * on a chain of new atoms (as many as the most rings one atom opened, one
 * more when that atom is cur: a ring bond may not double a bond); for an
 * aromatic atom off every cycle a ring through cur (digit, two atoms,
 * digit). An estimate, not a bound: the mask drops it when it leaves no
 * token. */
int mg_smiles_state_min_tokens(const mg_smiles_state *s) {
    int m = s->sp + s->nring_open;
    const int pend = s->prev == P_BOND || s->prev == P_OPEN || s->prev == P_DOT;
    if (s->nring_open > 0) {
        int chain = 0, all_close = !pend, need2 = 0, od[100];
        const int nod = open_rings(s, od);
        for (int q = 0; q < nod; q++) {
            const int d = od[q], o = s->ring_atom[d];
            int mult = 0;
            for (int e = 0; e < nod; e++) mult += s->ring_atom[od[e]] == o;
            const int on_cur = s->prev != P_DOT && o == s->cur;
            if (mult + on_cur > chain) chain = mult + on_cur;
            if (mult > 1 || o == s->cur || bonded(s, o, s->cur)) all_close = 0;
            need2 += order2_at(s, s->ring_sym[d]);
        }
        if (all_close && !fits(s, &s->atoms[s->cur], need2, s->nring_open)) all_close = 0;
        if (!all_close) m += chain > pend ? chain : pend;
    } else {
        m += pend;
        if (s->level != MG_CONSTRAIN_NONE && pending_aromatic(s)) m += 4;
    }
    return m;
}

int mg_smiles_syntax_ok(const char *smiles, char *why, size_t n) {
    if (!smiles) return reject(why, n, "NULL string");
    if (!smiles[0]) return reject(why, n, "empty string");
    int ntok = 0;
    {
        mg_error e;
        if (mg_tokenize(smiles, NULL, 0, &ntok, NULL, &e) == MG_ERR_TOKEN)
            return reject(why, n, "%s", e.message);
    }
    mg_smiles_state *s = NULL;
    if (mg_smiles_state_new(ntok > 0 ? ntok : 1, MG_CONSTRAIN_NONE, &s, NULL))
        return reject(why, n, "out of memory");
    s->src = smiles;
    int ok = 1;
    for (int pos = 0;;) {
        int l = mg_token_len(smiles + pos);
        if (l == 0) break;
        if (!mg_smiles_state_push(s, smiles + pos, l, why, n)) {
            ok = 0;
            break;
        }
        pos += l;
    }
    if (ok) ok = mg_smiles_state_end(s, why, n);
    mg_smiles_state_free(s);
    return ok;
}

int mg_smiles_check(const char *smiles, mg_constrain level, char *why, size_t n) {
    if (level == MG_CONSTRAIN_NONE) return mg_smiles_syntax_ok(smiles, why, n);
    if (!smiles) return reject(why, n, "NULL string");
    if (!smiles[0]) return reject(why, n, "empty string");
    int ntok = 0;
    {
        mg_error e;
        if (mg_tokenize(smiles, NULL, 0, &ntok, NULL, &e) == MG_ERR_TOKEN)
            return reject(why, n, "%s", e.message);
    }
    mg_smiles_state *s = NULL;
    if (mg_smiles_state_new(ntok > 0 ? ntok : 1, level, &s, NULL))
        return reject(why, n, "out of memory");
    s->src = smiles;
    int ok = 1;
    for (int pos = 0; ok;) {
        const int l = mg_token_len(smiles + pos);
        if (l == 0) break;
        ok = mg_smiles_state_push(s, smiles + pos, l, why, n);
        pos += l;
        /* a prefix the mask would refuse: no string through it is sampled */
        if (ok && !mg_smiles_state_viable(s))
            ok = reject(why, n, "position %d: the prefix %.*s cannot end well", pos, pos, smiles);
        if (ok && !mg_smiles_state_kekule(s, 0))
            ok = reject(why, n, "position %d: kekulisation refused after the prefix %.*s", pos,
                        pos, smiles);
    }
    if (ok) ok = mg_smiles_state_end(s, why, n);
    if (ok && !mg_smiles_state_kekule(s, 1)) ok = reject(why, n, "kekulisation impossible");
    mg_smiles_state_free(s);
    return ok;
}
