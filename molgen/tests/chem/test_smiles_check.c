/* Tests for molgen/chem/smiles_check.{h,c}: every molecule of the shared corpora
 * passes; hand-made valid edge cases pass; broken strings fail with a
 * reason. The valid / invalid edge cases were decided by RDKit 2022.09
 * (Chem.MolFromSmiles), except where marked "syntax only". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chem/smiles_check.h"
#include "chem/tokenizer.h"

#include "mg_test.h"

/* The string as --constrain valence lets it end (mg_smiles_check: each
 * prefix viable and passing the Kekulé check of a string still being
 * written, then the end checks and the final Kekulé check). */
static int valence_ok(const char *smi, char *why, size_t n) {
    return mg_smiles_check(smi, MG_CONSTRAIN_VALENCE, why, n);
}

static void test_corpus(const char *file) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", mg_test_data_dir(), file);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "cannot open %s (set MOLGEN_SHARED_DATA)\n", path);
        tu_fail++;
        return;
    }
    char buf[4096], why[256];
    long line = 0, bad = 0, bad_v = 0;
    while (fgets(buf, sizeof buf, f)) {
        line++;
        size_t l = strlen(buf);
        while (l && (buf[l - 1] == '\n' || buf[l - 1] == '\r')) buf[--l] = '\0';
        if (!mg_smiles_syntax_ok(buf, why, sizeof why)) {
            if (bad++ < 5) fprintf(stderr, "%s:%ld: %s rejected: %s\n", file, line, buf, why);
        }
        if (!valence_ok(buf, why, sizeof why)) { /* RDKit made these: the level must keep them */
            if (bad_v++ < 5)
                fprintf(stderr, "%s:%ld: %s rejected at level valence: %s\n", file, line, buf, why);
        }
    }
    fclose(f);
    printf("%s: %ld lines, %ld rejected, %ld at level valence\n", file, line, bad, bad_v);
    CHECK(line > 1000);
    CHECK(bad == 0);
    CHECK(bad_v == 0);
}

static const char *const k_valid[] = {
    "C",
    "CC",
    "c1ccccc1",
    "C1CCC1C",
    "C(C)(C)C",
    "C(=O)",
    "C(-C)",
    "CC(=O)O",
    "[C@@H](F)(Cl)Br",
    "[2H]C",
    "[13CH4]",
    "[C@H2]",
    "[se]1cccc1",
    "[te]1cccc1",
    "C=1CC1",
    "C1CC=1",
    "C=1CCC=1",
    "C=1CCC#1",
    "C-1CC-1",
    "C-1-CC1",
    "C/1=C/CCC\\1",
    "C\\1CC/1",
    "C%10CC%10",
    "C%99CC%99",
    "C$C",
    "C#C",
    "C:C",
    "C=C=C",
    "*C",
    "[*]C",
    "C1.C1",
    "C(C)1CC1",
    "C(C)=1CC1",
    "C(C)(C)1CC1",
    "C1(C)(C)CC1",
    "C(C1)C1",
    "C1(CC1)C",
    "C12(C)CC1C2",
    "C1CC2CC1C2",
    "C1C(C1)",
    "[N+2]",
    "[N++]",
    "[Fe+3]",
    "[Fe+10]",
    "[nH]1cccc1",
    "[nH+]1ccccc1",
    "[O-][N+](=O)C",
    "[C:1]",
    "[CH3:12]",
    "[CH+:1]",
    "[C@TH1H](F)(Cl)Br",
    "[CH-2]",
    "[H+]",
    "[HH]",
    "[OH3+]",
    "[N@@+]",
    "[C]",
    "C/C=C/C",
    "F/C=C\\F",
    "C1=CC=CC=C1",
    "[Cl-].[Na+]",
    "CC.CC",
    "[999C]",
    "[1000C]",
    "C1CC[C]1",
    "Cl/C=C\\Br",
    "OC(=O)C1CC1",
    "c1ccc2ccccc2c1",
    "C12CC1C2",
    "N1CC2CCC1C2",
    "CC(C)(C)c1ccc(O)cc1",
    "C1CCCCC1C1CCCCC1",
    "C(/F)=C/F",
    "C1CC1.C1CC1",
    "CC(C.C)",
    "CC(C.C)C",
    "O=C1CCC(=O)N1",
    "C$C",
    "C=C=C=C",
    "O=c1cccccc1",
    "c1ccc2c(c1)cccc2",
    "N#N",
    "CS(=O)(=O)C",
    "OP(=O)(O)O",
    "FC(F)(F)F",
    "IC(I)(I)I",
    "O=I(=O)C",
    "[nH]1cccc1=O" /* syntax only */,
    "C1C2C3C1C23",
    "CN(=O)=O",
    "C=N(=O)C",
    "CN(=O)(C)C",
    "O=n1ccccc1",
    "OCl(=O)(=O)=O",
    "CI(=O)=O",
    "O=N(=O)c1ccccc1",
    "CN(=O)=[O]",
    "Co1CCCCC1",
    "c1ccccc#1",
    "COc1cc#c(CC)cc1",
    "Cn1(C)CCCC1",
    "CN(#N)C",
    "CN=N#N",
    "CS:Clc1ccccc1",
    /* not checked (RDKit rejects for valence in brackets / kekulisation) */
    "[CH5]",
    "c1cccc1",
    "c1ccccc1=O",
};

static const struct {
    const char *smi;
    const char *why; /* substring of the reason */
} k_invalid[] = {
    {"", "empty"},
    {"CCX", "cannot tokenise"},
    {"C[NH", "cannot tokenise"},
    {"C[]C", "cannot tokenise"},
    {"=C", "starts with a bond"},
    {")C", "without '('"},
    {"(C)C", "'(' not after an atom"},
    {"1CC1", "starts with ring closure"},
    {".C", "starts with '.'"},
    {"C=", "ends with a bond"},
    {"C.", "ends with '.'"},
    {"CC(=O)O.", "ends with '.'"},
    {"C..C", "'.' not after an atom"},
    {"C==C", "two bonds in a row"},
    {"C-=C", "two bonds in a row"},
    {"C//C", "two bonds in a row"},
    {"C()C", "empty branch"},
    {"()C", "'(' not after an atom"},
    {"C((C))", "'(' not after an atom"},
    {"C(C", "unclosed '('"},
    {"C(C(C)", "unclosed '('"},
    {"C(C)C)", "')' without '('"},
    {"C(=)C", "bond before ')'"},
    {"C=(C)C", "'(' not after an atom"},
    {"C(.C)C", "'.' not after an atom"},
    {"C.(C)", "'(' not after an atom"},
    {"C=.C", "'.' not after an atom"},
    {".=C", "starts with '.'"},
    {"C1CC", "ring closure 1 never closed"},
    {"C1CC2CC1", "ring closure 2 never closed"},
    {"C%10CC", "ring closure 10 never closed"},
    {"C11", "closes on its own atom"},
    {"C1C1", "duplicates an existing bond"},
    {"C12CC12", "duplicates an existing bond"},
    {"C1CC(1)", "not after an atom"},
    {"C(=1)CC1", "not after an atom"},
    {"C.1CC1", "not after an atom"},
    {"C%01CC%01", "ring label"},
    {"C<C", "not SMILES"},
    {"C>C", "not SMILES"},
    {"CC>>CC", "not SMILES"},
    {"C?C", "not SMILES"},
    {"C~C", "not SMILES"},
    {"C@C", "not SMILES"},
    {"C+C", "not SMILES"},
    {"[Xx]", "bad element symbol"},
    {"[12]", "without an element symbol"},
    {"[C1]", "unexpected '1'"},
    {"[C@@@H]", "unexpected '@'"},
    {"[C:1H]", "unexpected 'H'"},
    {"[C+H]", "unexpected 'H'"},
    {"[C-+]", "unexpected '+'"},
    {"[SE]", "unexpected 'E'"},
    {"[C@XY1]", "unexpected 'X'"},
    {"[C@TH]", "bad chirality"},
    {"[C@TH3]", "bad chirality"},
    {"[C:]", "class number"},
    {"[c1]", "unexpected '1'"},
    {"[Cu++++]", "unexpected '+'"},
    /* valence of unbracketed atoms (lower bound, aromatic bonds count 1) */
    {"C(C)(C)(C)(C)C", "valence, more than 4"},
    {"CN(C)(C)C", "more than 3"},
    {"CN(=C)=C", "more than 3"},
    {"CN(=O)(=O)=O", "more than 5"},
    {"ClCl(=O)(=O)(=O)=O", "more than 7"},
    {"O=O=O", "more than 2"},
    {"FC=F", "more than 1"},
    {"ClCl(C)", "more than 1"},
    {"C=C1=CC1", "more than 4"},
    {"O=S(=O)(=O)O", "more than 6"},
    {"CC(=C)(=C)C", "more than 4"},
    /* aromatic atoms outside rings */
    {"cC", "not in a ring"},
    {"[c]", "not in a ring"},
    {"Cc1ccccc1n", "aromatic atom n is not in a ring"},
    {"c1ccccc1-c", "not in a ring"},
    {"[nH]C", "aromatic atom [nH] is not in a ring"},
    {"c1ccccc1.o", "not in a ring"},
};

static void test_cases(void) {
    char why[256];
    for (size_t i = 0; i < sizeof k_valid / sizeof *k_valid; i++) {
        why[0] = '\0';
        if (!mg_smiles_syntax_ok(k_valid[i], why, sizeof why)) {
            fprintf(stderr, "valid SMILES rejected: %s (%s)\n", k_valid[i], why);
            tu_fail++;
        }
    }
    for (size_t i = 0; i < sizeof k_invalid / sizeof *k_invalid; i++) {
        why[0] = '\0';
        int ok = mg_smiles_syntax_ok(k_invalid[i].smi, why, sizeof why);
        if (ok || !strstr(why, k_invalid[i].why)) {
            fprintf(stderr, "invalid SMILES \"%s\": ok=%d why='%s' (want '%s')\n", k_invalid[i].smi,
                    ok, why, k_invalid[i].why);
            tu_fail++;
        }
    }
    /* positions are reported */
    CHECK(!mg_smiles_syntax_ok("CC(C)C=", why, sizeof why) && strstr(why, "position 7"));
    CHECK(!mg_smiles_syntax_ok("CCC1CC", why, sizeof why) && strstr(why, "position 3"));
    CHECK(!mg_smiles_syntax_ok("CCQ", why, sizeof why) && strstr(why, "position 2"));
    /* NULL / small buffers are fine */
    CHECK(!mg_smiles_syntax_ok(NULL, why, sizeof why));
    CHECK(!mg_smiles_syntax_ok("C(", NULL, 0));
    char tiny[4];
    CHECK(!mg_smiles_syntax_ok("C(", tiny, sizeof tiny) && strlen(tiny) == 3);
    CHECK(mg_smiles_syntax_ok("C", NULL, 0));
    /* long inputs: deep branches and many rings */
    size_t n = 20000;
    char *s = malloc(3 * n + 2);
    size_t o = 0;
    s[o++] = 'C';
    for (size_t i = 0; i < n; i++) {
        s[o++] = '(';
        s[o++] = 'C';
    }
    for (size_t i = 0; i < n; i++) s[o++] = ')';
    s[o] = '\0';
    CHECK(mg_smiles_syntax_ok(s, why, sizeof why));
    s[o - 1] = '\0';
    CHECK(!mg_smiles_syntax_ok(s, why, sizeof why) && strstr(why, "1 unclosed"));
    free(s);
}

/* Kekulé structures at the VALENCE level: RDKit 2022.09's verdicts
 * (Chem.MolFromSmiles). Accepted: every atom that needs a double bond gets
 * one; refused: odd rings of atoms that all need one, n without H where
 * pyrrole needs [nH], an [nH] or o where pyridine needs n, rings that
 * could only pair through a chain bond. */
static void test_kekule(void) {
    static const char *const ok[] = {
        "c1ccccc1", "c1ccncc1", "c1cc[nH]c1", "c1ccc[nH]cc1", "c1ccc2[nH]ccc2c1", "c1cnc[nH]1",
        "c1ccsc1", "c1ccoc1", "O=c1cccc[nH]1", "O=c1ccccn1C", "[cH-]1cccc1", "c1cc[o+]cc1",
        "C[n+]1ccccc1", "[O-][n+]1ccccc1", "c1ccc2ccccc2c1", "c1ccc2cc3ccccc3cc2c1",
        "c1ccc(-c2ccccc2)cc1", "c1ccc(cc1)c1ccccc1", "Cn1cccc1", "c1ccc2c(c1)cccc2", "O=c1cccc1",
        "c1nc2ccccc2[nH]1", "c1ccc2nc[nH]c2c1", "Cc1nnc(C)o1", "c1cn[nH]c1",
        "O=c1[nH]c(=O)c2ccccc2[nH]1", "c1ccc2c(c1)[nH]c1ccccc12", "c1csc2ccccc12",
        "c1cc2cccc3ccc(c1)c23", "c1cc[se]c1", "Cc1ccc(-n2nccc2)cc1", "c1ccc2c(c1)C=Cc1ccccc1-2",
        "O=s1cccc1", "c1ccpcc1", "c1cc[pH]c1", "b1ccccc1", "c1cc[s+]cc1",
        "c1nsnc1", "c1ccc2nsnc2c1", "c1ccc2[se]ccc2c1", "c1cc[te]c1"};
    static const char *const bad[] = {"c1ccnc1",  "c1cccc1",       "c1ccocc1",   "c1ccc2c(c1)ccc2",
                                      "c1nc2ccccc2n1", "c1ccc2ncnc2c1", "c1cnnc1",
                                      "c1ccscc1", "c1csc(=C)n1", "c1ccpc1", "c1ccbc1",
                                      /* a chain bond between aromatic atoms is never
                                         double (RDKit): each ring has 5 c to pair */
                                      "c1cc(=O)ccc1c1ccc(=O)cc1", "O=c1ccc(cc1)c1ccc(=O)cc1",
                                      "O=c1ccc(c2ccc(=O)cc2)cc1"};
    char why[256];
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        CHECK(valence_ok(ok[i], why, sizeof why), "%s refused: %s", ok[i], why);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(!valence_ok(bad[i], why, sizeof why) && strstr(why, "kekulisation"),
              "%s accepted (or refused for another reason: %s)", bad[i], why);
        CHECK(mg_smiles_syntax_ok(bad[i], NULL, 0), "%s refused below the valence level", bad[i]);
    }
}

int main(void) {
    test_cases();
    test_kekule();
    test_corpus("moses_176k.smi");
    test_corpus("moses_train5k.smi");
    test_corpus("zinc250k_24k.smi");
    if (tu_fail) {
        fprintf(stderr, "test_smiles_check: %d failure(s)\n", tu_fail);
        return 1;
    }
    printf("test_smiles_check: OK\n");
    return 0;
}
