/* molgen: SMILES molecule generator on libattn. `molgen <command> ...`; each
 * command lives in its own file and is declared in commands.h. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "commands.h"
#include "base/dist.h"
#include "nn/packed_gemm.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary; /* NULL: hidden from the list */
} command;

static const command COMMANDS[] = {
    {"train", cmd_train, "train the model on a SMILES file (checkpoints, resume)"},
    {"sample", cmd_sample, "generate molecules from a trained model"},
    {"score", cmd_score, "negative log-likelihood of given molecules under a model"},
    {"optimize", cmd_optimize, "train an agent toward a scorer (REINVENT-style reinforcement learning)"},
    {"attention", cmd_attention, "draw a trained model's attention maps for a molecule"},
    {"bench", cmd_bench, "training tokens/s and sampling molecules/s"},
    {"debug-grads", cmd_debug_grads, NULL},
    {"debug-dap", cmd_debug_dap, NULL},
    {"debug-check", cmd_debug_check, NULL},
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

/* The commands that split their work over the ranks of `mpirun -np N`
 * (dist.h); the others refuse to run as several ranks. */
static const char *const RANKED[] = {"train", "sample", "score", "optimize"};

static int run_command(const command *c, int argc, char **argv) {
    mg_error e;
    if (mg_dist_init(&argc, &argv,
                     &e)) { /* no MPI to agree with: rank 0 (by mpirun's word) says it */
        const char *rank = getenv("OMPI_COMM_WORLD_RANK");
        if (!rank || !strcmp(rank, "0")) fprintf(stderr, "molgen %s: %s\n", c->name, e.message);
        return 1;
    }
    int ranked = 0;
    for (size_t i = 0; i < sizeof RANKED / sizeof RANKED[0]; i++)
        ranked |= !strcmp(c->name, RANKED[i]);
    int rc;
    mg_dist *world = mg_dist_world();
    /* every rank runs the same command (mpirun's MPMD form could start
     * others); a usage error is said once (mg_dist_hold_output) */
    const mg_dist_field cmd = {"the command", mg_dist_hash_str(c->name)};
    if (world->size > 1 && !ranked) {
        if (world->rank == 0)
            fprintf(stderr,
                    "molgen %s: does not run as several MPI ranks (train, sample, score, "
                    "optimize do)\n",
                    c->name);
        rc = 2;
    } else if (mg_dist_agree_fields(world, &cmd, 1, &e)) {
        if (e.status != MG_ERR_PEER)
            fprintf(stderr, "molgen %s: rank %d of %d: %s\n", c->name, world->rank, world->size,
                    e.message);
        rc = 1;
    } else {
        mg_dist_hold_output(argc, argv);
        rc = c->run(argc - 1, argv + 1);
    }
    mg_dist_finalize();
    return rc;
}

int main(int argc, char **argv) {
    /* Past a file-size limit (ulimit -f) a write must fail with EFBIG so that
     * the normal error path runs (temporary removed, the previous checkpoint
     * intact) instead of SIGXFSZ killing the process silently. */
    signal(SIGXFSZ, SIG_IGN);
    /* molgen is the application: it lets libattn's bf16 kernels and its own
     * bf16 products use AMX tiles where the CPU has them (a grant to this
     * process only; attn.h: mg_gemm_allow_amx asks through attn_enable_amx) */
    mg_gemm_allow_amx(1);
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
        if (!strcmp(argv[1], COMMANDS[i].name)) return run_command(&COMMANDS[i], argc, argv);
    fprintf(stderr, "molgen: unknown command '%s' (molgen --help lists them)\n", argv[1]);
    return 2;
}
