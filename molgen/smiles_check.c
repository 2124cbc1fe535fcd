/* molgen smiles_check: see smiles_check.h. */
#include "smiles_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static int fail(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *why, size_t n, const char *fmt, ...)
{
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

static int is_element(const char *s, int len)
{
    for (size_t i = 0; i < sizeof k_elements / sizeof *k_elements; i++)
        if ((int)strlen(k_elements[i]) == len && strncmp(k_elements[i], s, (size_t)len) == 0)
            return 1;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Validate the inside of a bracket atom s[0..len) (without the brackets).
 * Returns 1 or 0 with a reason (pos = offset of the '[' in the SMILES). */
static int bracket_ok(const char *s, int len, int pos, char *why, size_t n)
{
    int i = 0;
    while (i < len && is_digit(s[i])) /* isotope */
        i++;
    /* symbol */
    if (i >= len)
        return fail(why, n, "position %d: bracket atom without an element symbol", pos);
    static const char *const arom2[] = {"se", "as", "te"};
    int sym = 0;
    if (s[i] == '*') {
        sym = 1;
    } else if (s[i] >= 'a' && s[i] <= 'z') {
        for (size_t k = 0; k < 3; k++)
            if (i + 1 < len && strncmp(s + i, arom2[k], 2) == 0)
                sym = 2;
        if (!sym && strchr("bcnops", s[i]))
            sym = 1;
    } else if (s[i] >= 'A' && s[i] <= 'Z') {
        if (i + 1 < len && s[i + 1] >= 'a' && s[i + 1] <= 'z' && is_element(s + i, 2))
            sym = 2;
        else if (is_element(s + i, 1))
            sym = 1;
    }
    if (!sym)
        return fail(why, n, "position %d: bad element symbol in bracket atom [%.*s]", pos, len, s);
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
                if (strncmp(s + i, k_chir[k].cls, 2) == 0)
                    found = k;
            if (found >= 0) {
                i += 2;
                int v = 0, nd = 0;
                while (i < len && is_digit(s[i]) && nd < 3) {
                    v = v * 10 + (s[i] - '0');
                    i++;
                    nd++;
                }
                if (nd == 0 || v < 1 || v > k_chir[found].max)
                    return fail(why, n, "position %d: bad chirality in [%.*s]", pos, len, s);
            }
        }
    }
    /* hydrogen count */
    if (i < len && s[i] == 'H') {
        i++;
        if (i < len && is_digit(s[i]))
            i++;
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
            return fail(why, n, "position %d: ':' without a class number in [%.*s]", pos, len,
                        s);
    }
    if (i != len)
        return fail(why, n, "position %d: unexpected '%c' in bracket atom [%.*s]", pos + 1 + i,
                    s[i], len, s);
    return 1;
}

enum { P_NONE, P_ATOM, P_BOND, P_RING, P_OPEN, P_CLOSE, P_DOT };

typedef struct {
    int a, b;
} bondpair;

int mg_smiles_syntax_ok(const char *smiles, char *why, size_t n)
{
    if (!smiles)
        return fail(why, n, "NULL string");
    if (!smiles[0])
        return fail(why, n, "empty string");
    {
        char e[160];
        int ntok = 0;
        if (mg_tokenize(smiles, NULL, 0, &ntok, NULL, e, sizeof e) == MG_TOK_ERR_CHAR)
            return fail(why, n, "%s", e);
    }
    size_t slen = strlen(smiles);
    int *stack = malloc((slen + 1) * sizeof *stack);       /* branch points */
    bondpair *bonds = malloc((slen + 1) * sizeof *bonds); /* bonds so far */
    if (!stack || !bonds) {
        free(stack);
        free(bonds);
        return fail(why, n, "out of memory");
    }
    int ring_atom[100], ring_pos[100];
    for (int d = 0; d < 100; d++)
        ring_atom[d] = -1;
    int nring_open = 0;
    int sp = 0, nbonds = 0, natoms = 0;
    int cur = -1;          /* the atom new atoms / ring bonds attach to */
    int prev = P_NONE;
    int bond_after_open = 0; /* the pending bond came right after '(' */
    int ok = 1;
    int pos = 0;
    for (;;) {
        int l = mg_token_len(smiles + pos);
        if (l == 0)
            break;
        const char *t = smiles + pos;
        char c = t[0];
        if (c == '[' || (l == 2 && (c == 'C' || c == 'B')) || strchr("BCNOSPFIbcnosp*", c)) {
            /* atom */
            if (c == '[' && !bracket_ok(t + 1, l - 2, pos, why, n)) {
                ok = 0;
                break;
            }
            int a = natoms++;
            if (prev != P_NONE && prev != P_DOT) {
                bonds[nbonds].a = cur;
                bonds[nbonds].b = a;
                nbonds++;
            }
            cur = a;
            prev = P_ATOM;
            bond_after_open = 0;
        } else if (strchr("-=#$:/\\", c)) {
            if (prev == P_NONE) {
                ok = fail(why, n, "position %d: starts with a bond '%c'", pos, c);
                break;
            }
            if (prev == P_BOND) {
                ok = fail(why, n, "position %d: two bonds in a row", pos);
                break;
            }
            if (prev == P_DOT) {
                ok = fail(why, n, "position %d: bond '%c' after '.'", pos, c);
                break;
            }
            bond_after_open = prev == P_OPEN;
            prev = P_BOND;
        } else if (is_digit(c) || c == '%') {
            int d = c == '%' ? (t[1] - '0') * 10 + (t[2] - '0') : c - '0';
            if (c == '%' && d < 10) {
                ok = fail(why, n, "position %d: ring label '%.3s' (use a single digit)", pos, t);
                break;
            }
            if (prev == P_NONE) {
                ok = fail(why, n, "position %d: starts with ring closure %d", pos, d);
                break;
            }
            if (prev == P_OPEN || prev == P_DOT || (prev == P_BOND && bond_after_open)) {
                ok = fail(why, n, "position %d: ring closure %d not after an atom", pos, d);
                break;
            }
            if (ring_atom[d] < 0) {
                ring_atom[d] = cur;
                ring_pos[d] = pos;
                nring_open++;
            } else {
                int partner = ring_atom[d];
                if (partner == cur) {
                    ok = fail(why, n, "position %d: ring closure %d closes on its own atom", pos,
                              d);
                    break;
                }
                for (int k = 0; k < nbonds; k++)
                    if ((bonds[k].a == cur && bonds[k].b == partner) ||
                        (bonds[k].a == partner && bonds[k].b == cur)) {
                        ok = fail(why, n,
                                  "position %d: ring closure %d duplicates an existing bond", pos,
                                  d);
                        break;
                    }
                if (!ok)
                    break;
                bonds[nbonds].a = cur;
                bonds[nbonds].b = partner;
                nbonds++;
                ring_atom[d] = -1;
                nring_open--;
            }
            prev = P_RING;
        } else if (c == '(') {
            if (prev != P_ATOM && prev != P_RING && prev != P_CLOSE) {
                ok = fail(why, n, "position %d: '(' not after an atom", pos);
                break;
            }
            stack[sp++] = cur;
            prev = P_OPEN;
        } else if (c == ')') {
            if (sp == 0) {
                ok = fail(why, n, "position %d: ')' without '('", pos);
                break;
            }
            if (prev == P_OPEN) {
                ok = fail(why, n, "position %d: empty branch '()'", pos);
                break;
            }
            if (prev == P_BOND) {
                ok = fail(why, n, "position %d: bond before ')'", pos);
                break;
            }
            cur = stack[--sp];
            prev = P_CLOSE;
        } else if (c == '.') {
            if (prev == P_NONE) {
                ok = fail(why, n, "position %d: starts with '.'", pos);
                break;
            }
            if (prev == P_BOND || prev == P_DOT || prev == P_OPEN) {
                ok = fail(why, n, "position %d: '.' not after an atom", pos);
                break;
            }
            prev = P_DOT;
        } else {
            ok = fail(why, n, "position %d: '%c' is not SMILES outside a bracket atom", pos, c);
            break;
        }
        pos += l;
    }
    if (ok) {
        if (prev == P_BOND)
            ok = fail(why, n, "position %d: ends with a bond", pos);
        else if (prev == P_DOT)
            ok = fail(why, n, "position %d: ends with '.'", pos);
        else if (sp > 0)
            ok = fail(why, n, "position %d: %d unclosed '('", pos, sp);
        else if (nring_open > 0) {
            int first = -1;
            for (int d = 0; d < 100; d++)
                if (ring_atom[d] >= 0 && (first < 0 || ring_pos[d] < ring_pos[first]))
                    first = d;
            ok = fail(why, n, "position %d: ring closure %d never closed", ring_pos[first], first);
        }
    }
    free(stack);
    free(bonds);
    return ok;
}
