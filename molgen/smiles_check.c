/* molgen smiles_check: see smiles_check.h. */
#include "smiles_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

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

static int is_element(const char *s, int len) {
    for (size_t i = 0; i < sizeof k_elements / sizeof *k_elements; i++)
        if ((int)strlen(k_elements[i]) == len && strncmp(k_elements[i], s, (size_t)len) == 0)
            return 1;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Validate the inside of a bracket atom s[0..len) (without the brackets).
 * Returns 1 or 0 with a reason (pos = offset of the '[' in the SMILES). */
static int bracket_ok(const char *s, int len, int pos, char *why, size_t n) {
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
        if (i + 1 < len && s[i + 1] >= 'a' && s[i + 1] <= 'z' && is_element(s + i, 2))
            sym = 2;
        else if (is_element(s + i, 1))
            sym = 1;
    }
    if (!sym)
        return reject(why, n, "position %d: bad element symbol in bracket atom [%.*s]", pos, len,
                      s);
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
        if (i < len && is_digit(s[i])) i++;
    }
    /* charge */
    if (i < len && (s[i] == '+' || s[i] == '-')) {
        char sign = s[i++];
        if (i < len && s[i] == sign) {
            i++; /* "++" / "--" */
        } else {
            int nd = 0;
            while (i < len && is_digit(s[i]) && nd < 2) {
                i++;
                nd++;
            }
        }
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

/* t[0..len) is the inside of a bracket atom: after the isotope, a lowercase
 * symbol (c, n, o, p, s, se, as, te, b) is aromatic. */
static int bracket_aromatic(const char *t, int len) {
    int i = 0;
    while (i < len && is_digit(t[i])) i++;
    return i < len && t[i] >= 'a' && t[i] <= 'z';
}

/* t[0..len) is the inside of a bracket atom: is its element el ('O' or
 * 'N'; the aromatic form counts; "Os", "Na", "Nb" ... do not)? */
static int bracket_is(const char *t, int len, char el) {
    int i = 0;
    while (i < len && is_digit(t[i])) i++;
    if (i >= len || (t[i] != el && t[i] != el - 'A' + 'a')) return 0;
    if (t[i] == el && i + 1 < len && t[i + 1] >= 'a' && t[i + 1] <= 'z') return 0;
    return 1;
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
 * inring[a] = 1. Returns 0, or -1 on out-of-memory. */
static int ring_atoms(int natoms, const bondrec *bonds, int nbonds, unsigned char *inring) {
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
                } else if (disc[v] < low[u]) {
                    low[u] = disc[v]; /* back edge: u and v are on a cycle */
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

int mg_smiles_syntax_ok(const char *smiles, char *why, size_t n) {
    if (!smiles) return reject(why, n, "NULL string");
    if (!smiles[0]) return reject(why, n, "empty string");
    {
        mg_error e;
        int ntok = 0;
        if (mg_tokenize(smiles, NULL, 0, &ntok, NULL, &e) == MG_ERR_TOKEN)
            return reject(why, n, "%s", e.message);
    }
    size_t slen = strlen(smiles);
    int *stack = malloc((slen + 1) * sizeof *stack);     /* branch points */
    bondrec *bonds = malloc((slen + 1) * sizeof *bonds); /* bonds so far */
    atomrec *atoms = malloc((slen + 1) * sizeof *atoms);
    unsigned char *inring = calloc(slen + 1, 1);
    if (!stack || !bonds || !atoms || !inring) {
        free(stack);
        free(bonds);
        free(atoms);
        free(inring);
        return reject(why, n, "out of memory");
    }
    int ring_atom[100], ring_pos[100];
    char ring_sym[100];
    for (int d = 0; d < 100; d++) ring_atom[d] = -1;
    int nring_open = 0;
    int sp = 0, nbonds = 0, natoms = 0;
    int cur = -1; /* the atom new atoms / ring bonds attach to */
    int prev = P_NONE;
    int bond_after_open = 0; /* the pending bond came right after '(' */
    char bsym = 0;           /* pending bond symbol, 0 = implicit */
    int ok = 1;
    int pos = 0;
    for (;;) {
        int l = mg_token_len(smiles + pos);
        if (l == 0) break;
        const char *t = smiles + pos;
        char c = t[0];
        if (c == '[' || (l == 2 && (c == 'C' || c == 'B')) || strchr("BCNOSPFIbcnosp*", c)) {
            /* atom */
            if (c == '[' && !bracket_ok(t + 1, l - 2, pos, why, n)) {
                ok = 0;
                break;
            }
            int a = natoms++;
            atoms[a].pos = pos;
            atoms[a].len = l;
            if (c == '[') {
                atoms[a].maxval = 0;
                atoms[a].aromatic = bracket_aromatic(t + 1, l - 2);
                atoms[a].oxygen = bracket_is(t + 1, l - 2, 'O');
                atoms[a].nitrogen = bracket_is(t + 1, l - 2, 'N');
            } else {
                atoms[a].aromatic = c >= 'a' && c <= 'z';
                /* RDKit is lenient with lowercase atoms ("Co1CCCCC1" and
                 * "c1ccccc#1" parse), so only uppercase ones are checked */
                atoms[a].maxval = atoms[a].aromatic ? 0 : organic_maxval(t, l);
                atoms[a].oxygen = c == 'O' || c == 'o';
                atoms[a].nitrogen = c == 'N' || c == 'n';
            }
            atoms[a].maxval_o = atoms[a].maxval;
            if (c == 'N')
                atoms[a].maxval_o = 5;
            else if (l == 2 || c == 'I') /* Cl, Br, I */
                atoms[a].maxval_o = 7;
            if (prev != P_NONE && prev != P_DOT) {
                bonds[nbonds].a = cur;
                bonds[nbonds].b = a;
                bonds[nbonds].order2 = bond_order2(bsym);
                nbonds++;
            }
            cur = a;
            prev = P_ATOM;
            bond_after_open = 0;
            bsym = 0;
        } else if (strchr("-=#$:/\\", c)) {
            if (prev == P_NONE) {
                ok = reject(why, n, "position %d: starts with a bond '%c'", pos, c);
                break;
            }
            if (prev == P_BOND) {
                ok = reject(why, n, "position %d: two bonds in a row", pos);
                break;
            }
            if (prev == P_DOT) {
                ok = reject(why, n, "position %d: bond '%c' after '.'", pos, c);
                break;
            }
            bond_after_open = prev == P_OPEN;
            prev = P_BOND;
            bsym = c;
        } else if (is_digit(c) || c == '%') {
            int d = c == '%' ? (t[1] - '0') * 10 + (t[2] - '0') : c - '0';
            if (c == '%' && d < 10) {
                ok = reject(why, n, "position %d: ring label '%.3s' (use a single digit)", pos, t);
                break;
            }
            if (prev == P_NONE) {
                ok = reject(why, n, "position %d: starts with ring closure %d", pos, d);
                break;
            }
            if (prev == P_OPEN || prev == P_DOT || (prev == P_BOND && bond_after_open)) {
                ok = reject(why, n, "position %d: ring closure %d not after an atom", pos, d);
                break;
            }
            if (ring_atom[d] < 0) {
                ring_atom[d] = cur;
                ring_pos[d] = pos;
                ring_sym[d] = bsym;
                nring_open++;
            } else {
                int partner = ring_atom[d];
                if (partner == cur) {
                    ok = reject(why, n, "position %d: ring closure %d closes on its own atom", pos,
                                d);
                    break;
                }
                for (int k = 0; k < nbonds; k++)
                    if ((bonds[k].a == cur && bonds[k].b == partner) ||
                        (bonds[k].a == partner && bonds[k].b == cur)) {
                        ok = reject(why, n,
                                    "position %d: ring closure %d duplicates an existing bond", pos,
                                    d);
                        break;
                    }
                if (!ok) break;
                /* the bond symbol may be written at either end; when both
                 * are written RDKit uses one of them: count the smaller */
                int o1 = bond_order2(bsym);
                int o2 = bond_order2(ring_sym[d]);
                int order2 = o1;
                if (!bsym)
                    order2 = o2;
                else if (ring_sym[d] && o2 < o1)
                    order2 = o2;
                bonds[nbonds].a = cur;
                bonds[nbonds].b = partner;
                bonds[nbonds].order2 = order2;
                nbonds++;
                ring_atom[d] = -1;
                nring_open--;
            }
            prev = P_RING;
            bsym = 0;
        } else if (c == '(') {
            if (prev != P_ATOM && prev != P_RING && prev != P_CLOSE) {
                ok = reject(why, n, "position %d: '(' not after an atom", pos);
                break;
            }
            stack[sp++] = cur;
            prev = P_OPEN;
        } else if (c == ')') {
            if (sp == 0) {
                ok = reject(why, n, "position %d: ')' without '('", pos);
                break;
            }
            if (prev == P_OPEN) {
                ok = reject(why, n, "position %d: empty branch '()'", pos);
                break;
            }
            if (prev == P_BOND) {
                ok = reject(why, n, "position %d: bond before ')'", pos);
                break;
            }
            cur = stack[--sp];
            prev = P_CLOSE;
        } else if (c == '.') {
            if (prev == P_NONE) {
                ok = reject(why, n, "position %d: starts with '.'", pos);
                break;
            }
            if (prev == P_BOND || prev == P_DOT || prev == P_OPEN) {
                ok = reject(why, n, "position %d: '.' not after an atom", pos);
                break;
            }
            prev = P_DOT;
        } else {
            ok = reject(why, n, "position %d: '%c' is not SMILES outside a bracket atom", pos, c);
            break;
        }
        pos += l;
    }
    if (ok) {
        if (prev == P_BOND)
            ok = reject(why, n, "position %d: ends with a bond", pos);
        else if (prev == P_DOT)
            ok = reject(why, n, "position %d: ends with '.'", pos);
        else if (sp > 0)
            ok = reject(why, n, "position %d: %d unclosed '('", pos, sp);
        else if (nring_open > 0) {
            int first = -1;
            for (int d = 0; d < 100; d++)
                if (ring_atom[d] >= 0 && (first < 0 || ring_pos[d] < ring_pos[first])) first = d;
            ok =
                reject(why, n, "position %d: ring closure %d never closed", ring_pos[first], first);
        }
    }
    if (ok) { /* valence lower bound of unbracketed atoms */
        int *val2 = calloc((size_t)natoms + 1, sizeof *val2);
        unsigned char *dbl_o = calloc((size_t)natoms + 1, 1);
        if (!val2 || !dbl_o) {
            ok = reject(why, n, "out of memory");
        } else {
            for (int k = 0; k < nbonds; k++) {
                int x = bonds[k].a, y = bonds[k].b;
                val2[x] += bonds[k].order2;
                val2[y] += bonds[k].order2;
                if (bonds[k].order2 >= 4) {
                    dbl_o[x] |= (unsigned char)(atoms[y].oxygen ||
                                                (atoms[x].nitrogen && atoms[y].nitrogen));
                    dbl_o[y] |= (unsigned char)(atoms[x].oxygen ||
                                                (atoms[x].nitrogen && atoms[y].nitrogen));
                }
            }
            for (int a = 0; a < natoms && ok; a++) {
                int mv = dbl_o[a] ? atoms[a].maxval_o : atoms[a].maxval;
                if (mv && val2[a] > 2 * mv)
                    ok = reject(why, n,
                                "position %d: %.*s has %d bonds' worth of valence, more "
                                "than %d",
                                atoms[a].pos, atoms[a].len, smiles + atoms[a].pos,
                                (val2[a] + 1) / 2, mv);
            }
        }
        free(val2);
        free(dbl_o);
    }
    if (ok) { /* aromatic atoms must be on a ring */
        int any = 0;
        for (int a = 0; a < natoms; a++) any |= atoms[a].aromatic;
        if (any) {
            if (ring_atoms(natoms, bonds, nbonds, inring) != 0)
                ok = reject(why, n, "out of memory");
            for (int a = 0; a < natoms && ok; a++)
                if (atoms[a].aromatic && !inring[a])
                    ok = reject(why, n, "position %d: aromatic atom %.*s is not in a ring",
                                atoms[a].pos, atoms[a].len, smiles + atoms[a].pos);
        }
    }
    free(stack);
    free(bonds);
    free(atoms);
    free(inring);
    return ok;
}
