/* molgen: SMILES molecule generator on libattn. `molgen <command> ...`; each
 * command lives in its own file and is declared in commands.h. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "commands.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary; /* NULL: hidden from the list */
} command;

static const command COMMANDS[] = {
    {"train", cmd_train, "train the model on a SMILES file (checkpoints, resume)"},
    {"sample", cmd_sample, "generate molecules from a trained model"},
    {"score", cmd_score, "negative log-likelihood of given molecules under a model"},
    {"attention", cmd_attention, "draw a trained model's attention maps for a molecule"},
    {"bench", cmd_bench, "training tokens/s and sampling molecules/s"},
    {"debug-grads", cmd_debug_grads, NULL},
};

static void usage(FILE *f) {
    fprintf(f, "usage: molgen <command> [options]   (molgen <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (COMMANDS[i].summary) fprintf(f, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(
        f, "\nenvironment: ATTN_NUM_THREADS (threads), MOLGEN_SHARED_DATA (data folder),\n"
           "  OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep instead of spinning: much faster\n"
           "  on a loaded machine; make and the main job set it)\n");
}

int main(int argc, char **argv) {
    /* Past a file-size limit (ulimit -f) a write must fail with EFBIG so that
     * the normal error path runs (temporary removed, the previous checkpoint
     * intact) instead of SIGXFSZ killing the process silently. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        fprintf(
            stderr,
            "molgen: no command given (train, sample, score, attention or bench; molgen --help)\n");
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("molgen (libattn %s)\n", ATTN_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
        if (!strcmp(argv[1], COMMANDS[i].name)) return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "molgen: unknown command '%s' (molgen --help lists them)\n", argv[1]);
    return 2;
}
