/* molgen tokenizer: SMILES -> tokens -> ids, and the vocabulary.
 *
 * Tokenisation is the MolGPT / MOSES regex, implemented as a hand-written
 * scanner (no regex library):
 *
 *   (\[[^\]]+]|<|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9])
 *
 * i.e. a bracket atom ("[nH]", "[C@@H]", "[NH3+]") is one token; "Cl" and
 * "Br" are one token; "%10".."%99" are one token; every other token is a
 * single character. Unlike the Python findall(), a character that starts no
 * token is an error (with its 0-based byte position), never silently dropped.
 * Concatenating the tokens reproduces the input exactly.
 *
 * Vocabulary: ids 0, 1, 2 are the specials "<pad>", "<bos>", "<eos>"; ids
 * 3.. are the data tokens in strcmp order (as built by mg_vocab_build).
 *
 * Conventions (all of molgen's data side): functions return 0 on success and
 * a negative code on failure, and then write a one-line message into the
 * caller's buffer err[errlen] (err may be NULL). Nothing aborts or prints.
 */
#ifndef MG_TOKENIZER_H
#define MG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Special token ids. */
#define MG_PAD 0
#define MG_BOS 1
#define MG_EOS 2
#define MG_NUM_SPECIAL 3

/* Longest token (bytes, without NUL) the vocabulary accepts. Bracket atoms
 * longer than this are a tokenisation error (MG_TOK_ERR_CHAR at the '['). */
#define MG_TOKEN_MAX 31

/* Error codes (negative). */
#define MG_TOK_ERR_CHAR (-1)    /* a character that starts no token */
#define MG_TOK_ERR_TOOLONG (-2) /* more tokens than the caller's capacity */
#define MG_TOK_ERR_UNKNOWN (-3) /* a token not in the vocabulary */
#define MG_TOK_ERR_NOMEM (-4)
#define MG_TOK_ERR_ARG (-5)     /* NULL / invalid argument, bad vocab JSON, bad id */

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
 * MG_TOK_ERR_CHAR: err says "position P: cannot tokenise 'X'"; *errpos (may
 *   be NULL) = P, the 0-based byte offset; *ntok = tokens before it.
 * MG_TOK_ERR_TOOLONG: more than cap tokens; *ntok = the full token count if
 *   the whole string tokenises (so the caller can report the length), spans
 *   holds the first cap. spans may be NULL with cap 0 to just count. */
int mg_tokenize(const char *smiles, mg_span *spans, int cap, int *ntok,
                int *errpos, char *err, size_t errlen);

/* ------------------------------------------------------------ vocabulary */

typedef struct mg_vocab mg_vocab; /* opaque, immutable once built */

/* Build from n SMILES strings: every distinct token, sorted by strcmp, after
 * the three specials. Fails (MG_TOK_ERR_CHAR, message "smiles[i] position P:
 * ...") if any string does not tokenise. */
int mg_vocab_build(const char *const *smiles, size_t n, mg_vocab **out,
                   char *err, size_t errlen);

/* Build from a list of data tokens (duplicates removed, sorted; the three
 * specials must NOT be in the list). Each must be exactly one token. */
int mg_vocab_from_tokens(const char *const *tokens, size_t n, mg_vocab **out,
                         char *err, size_t errlen);

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
 * plus MG_TOK_ERR_UNKNOWN: "unknown token '[Se]' at position P". With
 * MG_TOK_ERR_TOOLONG, *n = full count as in mg_tokenize. */
int mg_vocab_encode(const mg_vocab *v, const char *smiles, int32_t *ids,
                    int cap, int *n, char *err, size_t errlen);

/* Decode ids[0..n) into out[outlen] (NUL-terminated): BOS and PAD are
 * skipped, decoding stops at the first EOS. Returns the string length (>= 0),
 * MG_TOK_ERR_ARG for an id out of range, MG_TOK_ERR_TOOLONG if out is too
 * small (out then holds a truncated, NUL-terminated prefix). */
int mg_vocab_decode(const mg_vocab *v, const int32_t *ids, int n, char *out,
                    size_t outlen, char *err, size_t errlen);

/* Serialise as a JSON array of all token strings in id order, specials
 * included: ["<pad>","<bos>","<eos>","#","(",...]. Returns a malloc'ed
 * NUL-terminated string (caller frees) or NULL on out-of-memory. */
char *mg_vocab_to_json(const mg_vocab *v);

/* Parse what mg_vocab_to_json wrote. Checks: a JSON array of strings, the
 * first three are exactly the specials, no duplicates, every other entry is
 * exactly one SMILES token. Ids are positions in the array (order kept). */
int mg_vocab_from_json(const char *json, size_t len, mg_vocab **out,
                       char *err, size_t errlen);

/* 1 if a and b have the same tokens in the same order, else 0. */
int mg_vocab_equal(const mg_vocab *a, const mg_vocab *b);

#ifdef __cplusplus
}
#endif
#endif /* MG_TOKENIZER_H */
