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
 * "Co1CCCCC1"), kekulisation, stereo consistency.
 * Meant never to reject what RDKit accepts: the rules were checked against
 * RDKit 2022.09 on edge cases and on 288k random token mutations of the
 * shared corpora (see the test and the commit history).
 */
#ifndef MG_SMILES_CHECK_H
#define MG_SMILES_CHECK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns 1 if smiles passes every check above, 0 if not; then why[n] (may
 * be NULL) gets a one-line reason with the 0-based byte position, e.g.
 * "position 4: ring closure 1 never closed". */
int mg_smiles_syntax_ok(const char *smiles, char *why, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* MG_SMILES_CHECK_H */
