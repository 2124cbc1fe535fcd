/* molgen subcommands. Each takes the arguments after "molgen", so argv[0] is
 * the subcommand's name ("train", "sample", ...), parses its own options,
 * prints its --help to stdout, and returns the process exit code (0 on
 * success; on an error it prints one line "molgen <cmd>: <reason>" to stderr
 * and returns non-zero). main.c dispatches to them by name. */
#ifndef MG_COMMANDS_H
#define MG_COMMANDS_H

#ifdef __cplusplus
extern "C" {
#endif

int cmd_train(int argc, char **argv);     /* cmd_train.c */
int cmd_sample(int argc, char **argv);    /* cmd_sample.c */
int cmd_attention(int argc, char **argv); /* cmd_attention.c */
int cmd_bench(int argc, char **argv);     /* cmd_bench.c */
int cmd_score(int argc, char **argv);     /* cmd_score.c */
int cmd_optimize(int argc, char **argv); /* cmd_optimize.c */
/* Hidden: dump a random batch's loss and gradients for the PyTorch oracle
 * test (molgen/tests/nn/test_model_torch.py). cmd_debug_grads.c. */
int cmd_debug_grads(int argc, char **argv);
/* Hidden: the DAP loss and gradient of molgen optimize for its float64
 * oracle (molgen/tests/rl/test_optimize.py). cmd_optimize.c. */
int cmd_debug_dap(int argc, char **argv);
/* Hidden: mg_smiles_check's verdicts at every level for stdin's SMILES, for
 * the RDKit comparison (molgen/tests/chem/test_smiles_rdkit.py). cmd_debug_check.c. */
int cmd_debug_check(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif /* MG_COMMANDS_H */
