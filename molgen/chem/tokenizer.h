/* molgen tokenizer: SMILES -> tokens -> ids, and the vocabulary.
 *
 * Tokenisation is the MolGPT / MOSES regex, implemented as a hand-written
 * scanner (no regex library):
 *
 *   (\[[^\]]+]|<|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9])
 *
 * i.e. a bracket atom ("[nH]", "[C@@H]", "[NH3+]") is one token (its bytes
 * must be valid UTF-8: a vocabulary is stored as JSON); "Cl" and
 * "Br" are one token; "%10".."%99" are one token; every other token is a
 * single character. Unlike the Python findall(), a character that starts no
 * token is an error (with its 0-based byte position), never silently dropped.
 * Concatenating the tokens reproduces the input exactly.
 *
 * Vocabulary: ids 0, 1, 2 are the specials "<pad>", "<bos>", "<eos>"; ids
 * 3.. are the data tokens in strcmp order (as built by mg_vocab_build), or
 * for an extended vocabulary (mg_vocab_extend, train --extend-vocab) the
 * base's tokens in its order followed by the new ones in strcmp order.
 * Lookups never depend on the id order (a sorted index).
 *
 * Conventions: errors.h (an mg_status, a one-line message in the caller's
 * mg_error). Nothing aborts or prints.
 */
#ifndef MG_TOKENIZER_H
#define MG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Special token ids. */
#define MG_PAD 0
#define MG_BOS 1
#define MG_EOS 2
#define MG_NUM_SPECIAL 3

/* Longest token (bytes, without NUL) the vocabulary accepts. Bracket atoms
 * longer than this are a tokenisation error (MG_ERR_TOKEN at the '['). */
#define MG_TOKEN_MAX 31

/* Errors (errors.h): MG_ERR_TOKEN a character that starts no token,
 * MG_ERR_TOO_LONG more tokens than the caller's capacity, MG_ERR_UNKNOWN_TOKEN
 * a token not in the vocabulary, MG_ERR_FORMAT bad vocabulary JSON,
 * MG_ERR_ARG a NULL / invalid argument or an id out of range, MG_ERR_NOMEM. */

/* ------------------------------------------------------------ scanning */

/* Length in bytes of the token starting at s[0] (s NUL-terminated): > 0,
 * 0 at the end of the string, -1 if s[0] starts no token (this includes an
 * unclosed '[', a '%' not followed by two digits, and a bracket atom longer
 * than MG_TOKEN_MAX). */
int mg_token_len(const char *s);

/* One token: bytes smiles[start .. start+len). */
typedef struct {
    int start;
    int len;
} mg_span;

/* Tokenise the NUL-terminated SMILES into spans[0..cap).
 * On success *ntok = number of tokens (0 for ""), returns 0.
 * MG_ERR_TOKEN: err says "position P: cannot tokenise 'X'"; *errpos (may
 *   be NULL) = P, the 0-based byte offset; *ntok = tokens before it.
 * MG_ERR_TOO_LONG: more than cap tokens; *ntok = the full token count if
 *   the whole string tokenises (so the caller can report the length), spans
 *   holds the first cap. spans may be NULL with cap 0 to just count. */
mg_status mg_tokenize(const char *smiles, mg_span *spans, int cap, int *ntok, int *errpos,
                      mg_error *err);

/* ------------------------------------------------------------ vocabulary */

typedef struct mg_vocab mg_vocab; /* opaque, immutable once built */

/* Build from n SMILES strings: every distinct token, sorted by strcmp, after
 * the three specials. Fails (MG_ERR_TOKEN, message "smiles[i] position P:
 * ...") if any string does not tokenise. */
mg_status mg_vocab_build(const char *const *smiles, size_t n, mg_vocab **out, mg_error *err);

/* Build from a list of data tokens (duplicates removed, sorted; the three
 * specials must NOT be in the list). Each must be exactly one token. */
mg_status mg_vocab_from_tokens(const char *const *tokens, size_t n, mg_vocab **out, mg_error *err);

/* base's ids unchanged, then the tokens[0..n) that base lacks (duplicates
 * removed, strcmp order) as ids mg_vocab_size(base)..: *added = how many
 * (may be NULL; 0 gives a copy of base). Each must be exactly one token and
 * not a special (MG_ERR_ARG). */
mg_status mg_vocab_extend(const mg_vocab *base, const char *const *tokens, size_t n,
                          mg_vocab **out, int *added, mg_error *err);

void mg_vocab_free(mg_vocab *v); /* NULL is fine */

/* Number of ids, specials included (27 for moses_176k: 3 + 24). */
int mg_vocab_size(const mg_vocab *v);

/* Token string of an id ("<pad>", "<bos>", "<eos>" for the specials), or
 * NULL if id is out of range. Owned by v. */
const char *mg_vocab_token(const mg_vocab *v, int id);

/* Id of the token tok[0..len) (len < 0: strlen(tok)), or -1 if absent.
 * Specials are found by their strings too. */
int mg_vocab_lookup(const mg_vocab *v, const char *tok, int len);

/* Tokenise + look up (no BOS/EOS added): ids[0..*n). Errors as mg_tokenize,
 * plus MG_ERR_UNKNOWN_TOKEN: "unknown token '[Se]' at position P". With
 * MG_ERR_TOO_LONG, *n = full count as in mg_tokenize. */
mg_status mg_vocab_encode(const mg_vocab *v, const char *smiles, int32_t *ids, int cap, int *n,
                          mg_error *err);

/* Decode ids[0..n) into out[outlen] (NUL-terminated): BOS and PAD are
 * skipped, decoding stops at the first EOS; *len (may be NULL) = the string
 * length. MG_ERR_ARG for an id out of range, MG_ERR_TOO_LONG if out is too
 * small (out then holds a truncated, NUL-terminated prefix). */
mg_status mg_vocab_decode(const mg_vocab *v, const int32_t *ids, int n, char *out, size_t outlen,
                          size_t *len, mg_error *err);

/* Serialise as a JSON array of all token strings in id order, specials
 * included: ["<pad>","<bos>","<eos>","#","(",...]. Returns a malloc'ed
 * NUL-terminated string (caller frees) or NULL on out-of-memory. */
char *mg_vocab_to_json(const mg_vocab *v);

/* Parse what mg_vocab_to_json wrote. Checks: a JSON array of strings, the
 * first three are exactly the specials, no duplicates, every other entry is
 * exactly one SMILES token. Ids are positions in the array (order kept). */
mg_status mg_vocab_from_json(const char *json, size_t len, mg_vocab **out, mg_error *err);

/* 1 if a and b have the same tokens in the same order, else 0. */
int mg_vocab_equal(const mg_vocab *a, const mg_vocab *b);

#ifdef __cplusplus
}
#endif
#endif /* MG_TOKENIZER_H */
