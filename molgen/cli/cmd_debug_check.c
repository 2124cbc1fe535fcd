/* `molgen debug-check` (hidden, for tests): each line of stdin (a SMILES,
 * anything after the first space or tab ignored) through mg_smiles_check at
 * levels none, syntax and valence; one line out per line in:
 * "N S V<TAB>reason" with N S V 1 (passes) or 0, the reason the first
 * refusing level's. molgen/tests/chem/test_smiles_rdkit.py compares the verdicts
 * with RDKit's. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "chem/smiles_check.h"

int cmd_debug_check(int argc, char **argv) {
    (void)argv;
    if (argc > 1) {
        fprintf(stderr, "usage: molgen debug-check < SMILES_FILE   (testing tool)\n");
        return 2;
    }
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, " \t\r\n")] = '\0';
        char why[256] = "";
        int v[3];
        for (int k = 0; k < 3; k++) {
            char w[256] = "";
            v[k] = mg_smiles_check(line, (mg_constrain)k, w, sizeof w);
            if (!v[k] && !why[0]) snprintf(why, sizeof why, "%s", w);
        }
        printf("%d %d %d\t%s\n", v[0], v[1], v[2], why);
    }
    return 0;
}
