/* molgen smiles_check: what can be checked about a SMILES string without a
 * chemistry toolkit. A cheap pre-filter and a lower bound on invalidity;
 * RDKit (molgen/metrics.py) is the authority on validity.
 *
 * Checked:
 *   - not empty; tokenises (MolGPT regex, see tokenizer.h);
 *   - only SMILES tokens: no '<', '>', '?', '~' (reaction / SMARTS);
 *   - bracket atoms well-formed: [isotope? symbol chirality? hcount? charge?
 *     class?] with a real element symbol (or aromatic b c n o p s se as te,
 *     or '*'), chirality @ @@ @TH1-2 @AL1-2 @SP1-3 @TB1-20 @OH1-30,
 *     H / Hn, charge + - +n -n ++ --, class :n;
 *   - grammar: an atom first; a bond ('-' '=' '#' '$' ':' '/' '\') only
 *     after an atom, ring closure or ')' and before an atom or ring-closure
 *     digit, never twice in a row, never before ')' '.' or the end;
 *     branches '(' follow an atom, ring closure or ')', are non-empty and
 *     closed; no unmatched ')'; '.' after an atom, ring closure or ')' and
 *     before an atom (RDKit accepts it inside a branch: "CC(C.C)");
 *   - ring closures (1-9, %10-%99; "%01".."%09" rejected as RDKit does):
 *     not at the start of a branch / fragment, each opened label closed, not
 *     closed on the atom that opened it, not duplicating an existing bond
 *     between the same two atoms. Differing bond symbols at the two ends
 *     ("C=1CCC#1") are accepted, as RDKit 2022.09 does.
 *   - valence of unbracketed aliphatic (uppercase) atoms: the sum of bond
 *     orders (implicit bonds counted as single, ':' as nothing: a lower
 *     bound) must not exceed the largest valence RDKit accepts for the
 *     neutral atom (B 3, C 4, N 3, O 2, S 6, P 7, F Cl Br 1, I 5; with a
 *     multiple bond to O: N 5 and Cl Br I 7, and N 5 with a multiple bond
 *     to N, which RDKit's clean-up turns into nitro / N-oxide / perhalate /
 *     azide / diazonium charges);
 *   - aromatic atoms (lowercase, also in brackets) must be on a ring
 *     (RDKit: "non-ring atom marked aromatic").
 * Not checked: valences of bracket and aromatic atoms (RDKit tolerates e.g.
 * "Co1CCCCC1"), kekulisation (mg_smiles_state_kekule does, for the mask),
 * stereo consistency.
 * Meant never to reject what RDKit accepts: the rules were checked against
 * RDKit 2022.09 on edge cases and on 288k random token mutations of the
 * shared corpora (see the test and the commit history).
 */
#ifndef MG_SMILES_CHECK_H
#define MG_SMILES_CHECK_H

#include <stddef.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1 if smiles passes every check above, 0 if not; then why[n] (may
 * be NULL) gets a one-line reason with the 0-based byte position, e.g.
 * "position 4: ring closure 1 never closed". */
int mg_smiles_syntax_ok(const char *smiles, char *why, size_t n);

/* ------------------------------------------------------------ incremental
 * The parser behind mg_smiles_syntax_ok, one token at a time: the check
 * above is new + push of every token + end. Constrained sampling
 * (constrain.h) asks the same parser whether a token may come next.
 *
 * Levels:
 *   MG_CONSTRAIN_NONE     exactly the checks above (valence at the end).
 *   MG_CONSTRAIN_SYNTAX   the same rules, checked on every bond as it is
 *                         made, with what the token commits the atom to: a
 *                         bond symbol, '(' and an opened ring bond count
 *                         against the valence of the atom they start at
 *                         (a multiple bond to O raises N / Cl / Br / I only
 *                         once it is there: a little stricter than the
 *                         check above on hypervalent halogens); a bond
 *                         symbol at a ring closure must agree with the one
 *                         at its opening.
 *   MG_CONSTRAIN_VALENCE  also bracket atoms (the valence of the
 *                         isoelectronic neutral element, H count included:
 *                         [NH+] as C, [O-] as F, [nH] as N) and aromatic
 *                         atoms (bonds counted as single: c 4, n 3, o 2,
 *                         s 4, p 3, b 3; at most 3 neighbours); ':' counts
 *                         as a single bond; unbracketed N stays at 3 and
 *                         Cl / Br at 1 with a multiple bond to O (RDKit
 *                         refuses C-N(=O)-C; nitro is [N+](=O)[O-]). */
typedef enum {
    MG_CONSTRAIN_NONE = 0,
    MG_CONSTRAIN_SYNTAX = 1,
    MG_CONSTRAIN_VALENCE = 2
} mg_constrain;

/* "none" / "syntax" / "valence"; parse returns 1 and sets *out, or 0. */
const char *mg_constrain_name(mg_constrain c);
int mg_constrain_parse(const char *s, mg_constrain *out);

typedef struct mg_smiles_state mg_smiles_state;

/* A parser for strings of at most cap tokens (MG_ERR_ARG, MG_ERR_NOMEM). */
mg_status mg_smiles_state_new(int cap, mg_constrain level, mg_smiles_state **out, mg_error *err);
void mg_smiles_state_free(mg_smiles_state *s); /* NULL fine */
/* Back to the empty string. */
void mg_smiles_state_reset(mg_smiles_state *s);
/* dst (same capacity or more) becomes a copy of src. */
void mg_smiles_state_copy(mg_smiles_state *dst, const mg_smiles_state *src);
/* Append the token t[0..l): 1 if the rules allow it (the state advances),
 * 0 with a reason in why[n] if not (the state is then unusable until reset
 * or copied over). */
int mg_smiles_state_push(mg_smiles_state *s, const char *t, int l, char *why, size_t n);
/* 1 if the string so far may end here (every end check passes), else 0
 * with a reason. */
int mg_smiles_state_end(mg_smiles_state *s, char *why, size_t n);
/* Levels SYNTAX / VALENCE: 0 if the string can no longer end well: open
 * ring bonds that cannot close (neither the current atom nor an atom a ')'
 * returns to has room for one more bond), or an aromatic atom off every
 * cycle that no future ring bond can put on one (it is neither an atom new
 * bonds attach to nor on the tree path from an open ring bond's atom to
 * one); 1 otherwise. */
int mg_smiles_state_viable(mg_smiles_state *s);
/* Level VALENCE: 0 if the aromatic atoms can no longer get a Kekulé
 * structure (alternating bonds, which RDKit's sanitisation needs): an atom
 * that needs a double bond to an aromatic neighbour (c without one, pyridine's
 * n, [nH+], [o+]) has none left to pair with, counting as able to pair
 * later the atoms new bonds can still reach; final: the string ends here
 * (nothing can be reached). o, s (valence 2), [nH] and n with three bonds
 * take no double bond; p, b, n need one with two bonds. Permissive where
 * unsure (se, te, P(V) and bracket atoms of several valences may take one
 * or not; an explicit '-' never becomes double); only bonds on a cycle may (RDKit
 * makes no chain bond double: c1cc(=O)ccc1c1cc(=O)ccc1 is refused), and,
 * while a string is written, the chain bonds a later ring closure can still
 * put on one (on a tree path between cur, the branch points and the atoms
 * holding open ring bonds); 1 at the other levels. Checked on every molecule of the shared corpora (none is
 * refused) and on RDKit's verdicts for ring systems (smiles_check tests). */
int mg_smiles_state_kekule(mg_smiles_state *s, int final);
/* The whole string through the parser at a level, as constrained sampling
 * lets it end: every token pushed, each prefix passing
 * mg_smiles_state_viable and mg_smiles_state_kekule(s, 0), then mg_smiles_state_end and
 * mg_smiles_state_kekule(s, 1). Level NONE is mg_smiles_syntax_ok. 1 if it
 * passes, else 0 with a reason in why[n]. */
int mg_smiles_check(const char *smiles, mg_constrain level, char *why, size_t n);
/* Tokens pushed so far, and an estimate of the tokens still needed before
 * the string can end (closing branches and rings, an atom after a bond). */
int mg_smiles_state_tokens(const mg_smiles_state *s);
int mg_smiles_state_min_tokens(const mg_smiles_state *s);

#ifdef __cplusplus
}
#endif
#endif /* MG_SMILES_CHECK_H */
