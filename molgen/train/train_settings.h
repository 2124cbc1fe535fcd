/* molgen training settings, declared once.
 *
 * Every setting of `molgen train` is one line of MG_TRAIN_SETTINGS below.
 * From that line come: its field of mg_train_config (below) or the model /
 * optimizer config member it sets, its default, its range (checked on the
 * command line, by mg_train_run and when a checkpoint is read), its option
 * and --help text (a row of option_table.h, which cli_options.h reads as
 * every command's table), and whether and how a checkpoint keeps it
 * (checkpoint.c). To add a setting: add its line here, then use the field
 * where it acts. A setting that a checkpoint saves (CKPT_NEW) needs a
 * default that reproduces how runs trained before it existed, because their
 * checkpoints lack it and resume with the default.
 *
 * X(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group, help)
 *   key     JSON key in the checkpoint's "train" metadata, and the name in
 *           messages
 *   field   member of mg_train_config (model.* / optim.*: of its
 *           mg_model_config / mg_adamw_config)
 *   kind    STR (const char *), INT (int), I64 (int64_t), U64 (uint64_t,
 *           decimal digits only; a JSON string in the checkpoint), F64
 *           (double), F32 (float), FLAG (int; the option alone sets it to
 *           the opposite of its default)
 *   cli     option name without "--"
 *   arg     the option's value in --help ("" for a FLAG)
 *   def     default (model.* / optim.*: unused, the owner's
 *           mg_model_config_default / mg_adamw_config_default)
 *   lo, hi  range of INT, I64, F64, F32 values, with
 *   bounds  MG_CLOSED [lo, hi], MG_OPEN_HI [lo, hi), MG_OPEN_LO (lo, hi],
 *           MG_OPEN (lo, hi)
 *   save    RUN       this run's only; a resumed run takes the new value
 *           CKPT      kept in "train"; a resumed run takes the checkpoint's
 *           CKPT_NEW  the same, and a checkpoint without it (written before
 *                     the setting existed) gets the default
 *           MODEL     kept in the model's "config"; fixed by the checkpoint
 *           OPTIM     kept in the optimizer's "optim"; fixed by the checkpoint
 *   resume  what the option does when given with --resume:
 *           NEW   the value given applies to the resumed run (a saved
 *                 setting: it replaces the checkpoint's)
 *           SAME  the checkpoint's value is the run's: the same value is
 *                 accepted, another refused (the run continues bit for bit)
 *           PATH  a path to the same content (checked by its hash)
 *   group   the --help section (MG_GROUP_*)
 *   help    one sentence for --help (defaults and ranges are added) */
#ifndef MG_TRAIN_SETTINGS_H
#define MG_TRAIN_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dist.h"
#include "base/errors.h"
#include "nn/model.h"
#include "nn/optim.h"
#include "base/option_table.h"
#include "base/util.h" /* MG_MAX_THREADS */

/* Default token limit per molecule: longer lines are skipped and counted
 * like every other bad line, so that one runaway line cannot set the context
 * length (MOSES molecules have at most 57 tokens). */
#define MG_MAX_TOKENS_DEFAULT 256
/* Longest --time-limit (a year, in seconds): larger values would overflow
 * the step estimates' float -> int64 conversions. */
#define MG_TIME_LIMIT_MAX 3.2e7
#define MG_STEPS_MAX (INT64_MAX / 8)
/* Largest --ema decay: the average lives in 32-bit floats, where an update
 * weight 1 - decay below 2^-24 cannot move a value by its own size, so a
 * decay closer to 1 would silently act as a frozen average. */
#define MG_EMA_MAX 0.99999994
/* Fine-tuning (--init) defaults where the option is not given: the peak
 * learning rate, the validation fraction and its least size in molecules
 * (a quarter of the data when that is fewer), the patience in validations,
 * the validations per epoch and the molecules sampled for the end-of-run
 * check (measured on focused sets of a few hundred molecules:
 * tools/finetune_eval.py). */
#define MG_FINETUNE_LR 3e-4
#define MG_FINETUNE_VAL_FRAC 0.1
#define MG_FINETUNE_VAL_MIN 50
#define MG_FINETUNE_PATIENCE 5
#define MG_FINETUNE_SAMPLES 500
/* The sample check's targets for a fine-tuned model (the report warns past
 * them): syntax validity at most this many points below the base model's,
 * copies of the fine-tuning set under this share (%) of the valid samples. */
#define MG_FINETUNE_VALID_DROP 3.0
#define MG_FINETUNE_COPY_MAX 5.0
/* --extend-vocab: a new token's output row starts at a bias this many nats
 * below a lower bound of MODEL's log-partition (mg_model_extend_vocab), so
 * its probability is <= e^-18 at any input and MODEL's own tokens'
 * probabilities change by a factor >= 1 / (1 + n e^-18) (n new tokens):
 * below fp32 rounding for n < 4. */
#define MG_EXTEND_MARGIN 18.0

#define MG_GROUP_DATA "Data and output"
#define MG_GROUP_LENGTH "Length (whichever comes first; one of them is required for a fresh run)"
#define MG_GROUP_MODEL "Model (with --resume: the checkpoint's)"
#define MG_GROUP_OPTIM "Optimizer (AdamW, warm-up + cosine; with --resume: the checkpoint's)"
#define MG_GROUP_RUN "Run"
#define MG_GROUP_TEST "Testing"

#define MG_TRAIN_SETTINGS(X)                                                                       \
    X(data, data_path, STR, "data", "FILE", NULL, 0, 0, MG_CLOSED, CKPT, PATH, MG_GROUP_DATA,      \
      ".smi (first field per line) or .csv (see --csv-column); default "                           \
      "$MOLGEN_SHARED_DATA/moses_176k.smi when that is set, else data/moses_20k.smi; with "        \
      "--resume it replaces the checkpoint's path (the content must be the same)")                 \
    X(csv_column, csv_column, STR, "csv-column", "NAME", "smiles", 0, 0, MG_CLOSED, CKPT, SAME,    \
      MG_GROUP_DATA, "CSV column with the SMILES")                                                 \
    X(condition, condition, STR, "condition", "NAMES", NULL, 0, 0, MG_CLOSED, CKPT_NEW, SAME,      \
      MG_GROUP_DATA,                                                                               \
      "numeric CSV columns (comma-separated, e.g. logp,qed) that condition the model, each "       \
      "normalised by its training mean and std (molgen sample --condition name=value)")            \
    X(condition_drop, condition_drop, F64, "condition-drop", "X", 0.2, 0, 1, MG_CLOSED, CKPT_NEW,  \
      SAME, MG_GROUP_DATA,                                                                         \
      "probability of dropping each condition of a row in training (its missing embedding), so "   \
      "that any subset can be given when sampling")                                                \
    X(scaffold_column, scaffold_column, STR, "scaffold-column", "NAME", NULL, 0, 0, MG_CLOSED,     \
      CKPT_NEW, SAME, MG_GROUP_DATA,                                                               \
      "CSV column with each molecule's scaffold SMILES (molgen/props.py writes 'scaffold'): "      \
      "trained as a prefix with no loss, BOS scaffold BOS molecule EOS, so that molgen sample "    \
      "--scaffold S builds on S; an empty field (acyclic molecule) trains without one")            \
    X(scaffold_drop, scaffold_drop, F64, "scaffold-drop", "X", 0.3, 0, 1, MG_CLOSED, CKPT_NEW,     \
      SAME, MG_GROUP_DATA,                                                                         \
      "probability of training a row without its scaffold prefix, so that the model samples "      \
      "without one too")                                                                           \
    X(augment, augment, STR, "augment", "none|randomized", "none", 0, 0, MG_CLOSED, CKPT_NEW,      \
      SAME, MG_GROUP_DATA,                                                                         \
      "randomized: each time a molecule is drawn, train on one of its random SMILES from "         \
      "--augment-file (chosen by seed, step and batch slot); validation stays on the data as "     \
      "written")                                                                                   \
    X(augment_file, augment_file, STR, "augment-file", "FILE", NULL, 0, 0, MG_CLOSED, CKPT_NEW,    \
      PATH, MG_GROUP_DATA,                                                                         \
      "randomized copies of each data line, made by python3 -m molgen.randomize_smiles DATA FILE; "\
      "the vocabulary and context cover them; with --resume it replaces the checkpoint's path "    \
      "(the content must be the same)")                                                            \
    X(out, out_path, STR, "out", "FILE", NULL, 0, 0, MG_CLOSED, RUN, NEW, MG_GROUP_DATA,           \
      "checkpoint written periodically and at the end, atomically (default "                       \
      "out/model.safetensors, or the --resume file)")                                              \
    X(resume, resume_path, STR, "resume", "FILE", NULL, 0, 0, MG_CLOSED, RUN, NEW, MG_GROUP_DATA,  \
      "continue a checkpoint bit for bit: its model, optimizer, data split and every setting "     \
      "it keeps")                                                                                  \
    X(init, init_path, STR, "init", "MODEL", NULL, 0, 0, MG_CLOSED, CKPT_NEW, SAME, MG_GROUP_DATA, \
      "fine-tune: start from MODEL's weights, configuration and vocabulary (a model file or a "    \
      "checkpoint) with a fresh optimizer and schedule; data with tokens MODEL lacks is refused "  \
      "(see --extend-vocab), lines longer than its context are skipped and counted; model "        \
      "options must agree with MODEL's (--dropout may differ)")                                    \
    X(extend_vocab, extend_vocab, FLAG, "extend-vocab", "", 0, 0, 1, MG_CLOSED, CKPT_NEW, SAME,    \
      MG_GROUP_DATA,                                                                               \
      "with --init: add the data's tokens that MODEL lacks to its vocabulary (new embedding rows " \
      "at the mean of the old ones, new output rows whose probability starts below e^-18, so "     \
      "MODEL's probabilities of its own tokens are unchanged at step 0); without it such data is " \
      "refused with a list of those tokens")                                                       \
    X(max_tokens, max_tokens, INT, "max-tokens", "N", MG_MAX_TOKENS_DEFAULT, 0, 1000000,           \
      MG_CLOSED, CKPT, SAME, MG_GROUP_DATA,                                                        \
      "skip molecules longer than N tokens (0 = no limit); skipped lines are reported as "         \
      "file:line")                                                                                 \
    X(val_frac, val_frac, F64, "val-frac", "X", 0.05, 0, 1, MG_OPEN_HI, CKPT, SAME, MG_GROUP_DATA, \
      "validation fraction, split by seed (with --init: default 0.1, and at least 50 molecules "   \
      "or a quarter of the data)")                                                                 \
    X(steps, steps, I64, "steps", "N", 0, 0, MG_STEPS_MAX, MG_CLOSED, RUN, NEW, MG_GROUP_LENGTH,   \
      "optimizer steps of the schedule (total, from step 0; 0 = the checkpoint's, or sized from "  \
      "the time limit)")                                                                           \
    X(time_limit, time_limit, F64, "time-limit", "SEC", 0, 0, MG_TIME_LIMIT_MAX, MG_CLOSED, RUN,   \
      NEW, MG_GROUP_LENGTH,                                                                        \
      "wall-clock limit in seconds for this run (0 = none); without --steps the schedule length "  \
      "is estimated from 10 timed steps")                                                          \
    X(n_layer, model.n_layer, INT, "layers", "N", 0, 1, 1024, MG_CLOSED, MODEL, SAME,              \
      MG_GROUP_MODEL, "transformer blocks")                                                        \
    X(d_model, model.d_model, INT, "d-model", "N", 0, 1, 65536, MG_CLOSED, MODEL, SAME,            \
      MG_GROUP_MODEL, "width of the residual stream")                                              \
    X(n_head, model.n_head, INT, "heads", "N", 0, 1, 65536, MG_CLOSED, MODEL, SAME,                \
      MG_GROUP_MODEL, "attention heads (they divide --d-model)")                                   \
    X(ctx_len, model.ctx_len, INT, "ctx-len", "N", 0, 0, 65536, MG_CLOSED, MODEL, SAME,            \
      MG_GROUP_MODEL, "positions (0 = the longest molecule + 1)")                                  \
    X(dropout, model.dropout, F32, "dropout", "X", 0, 0, 1, MG_OPEN_HI, MODEL, SAME,               \
      MG_GROUP_MODEL, "embedding, residual and attention dropout")                                 \
    X(cond_bos, model.cond_bos, FLAG, "condition-prefix", "", 0, 0, 1, MG_CLOSED, MODEL, SAME,     \
      MG_GROUP_MODEL,                                                                              \
      "add the condition embedding at the first position only (MolGPT's prefix) instead of "       \
      "every position")                                                                            \
    X(batch_size, batch_size, INT, "batch-size", "N", 32, 1, 1 << 20, MG_CLOSED, CKPT, SAME,       \
      MG_GROUP_OPTIM, "molecules per step")                                                        \
    X(lr, optim.lr, F32, "lr", "X", 0, 0, 10, MG_OPEN, OPTIM, SAME, MG_GROUP_OPTIM,                \
      "peak learning rate (default 0.002; with --init 0.0003)")                                    \
    X(min_lr_frac, optim.min_lr_frac, F32, "min-lr-frac", "X", 0, 0, 1, MG_CLOSED, OPTIM, SAME,    \
      MG_GROUP_OPTIM, "final learning rate as a fraction of the peak")                             \
    X(warmup_steps, optim.warmup_steps, I64, "warmup", "N", 0, 0, MG_STEPS_MAX, MG_CLOSED, OPTIM,  \
      SAME, MG_GROUP_OPTIM, "linear warm-up steps (shortened to a tenth of a short run)")          \
    X(weight_decay, optim.weight_decay, F32, "weight-decay", "X", 0, 0, 1, MG_OPEN_HI, OPTIM,      \
      SAME, MG_GROUP_OPTIM, "decoupled weight decay of the weight matrices")                       \
    X(grad_clip, optim.grad_clip, F32, "grad-clip", "X", 0, 0, 1e30, MG_CLOSED, OPTIM, SAME,       \
      MG_GROUP_OPTIM, "global gradient-norm clip (0 = off)")                                       \
    X(beta1, optim.beta1, F32, "beta1", "X", 0, 0, 1, MG_OPEN_HI, OPTIM, SAME, MG_GROUP_OPTIM,     \
      "AdamW's first-moment decay")                                                                \
    X(beta2, optim.beta2, F32, "beta2", "X", 0, 0, 1, MG_OPEN_HI, OPTIM, SAME, MG_GROUP_OPTIM,     \
      "AdamW's second-moment decay")                                                               \
    X(label_smoothing, label_smoothing, F32, "label-smoothing", "X", 0, 0, 1, MG_OPEN_HI,          \
      CKPT_NEW, SAME, MG_GROUP_OPTIM,                                                              \
      "training loss against (1 - X) the target + X spread over all tokens")                       \
    X(freeze, freeze, INT, "freeze", "N", 0, 0, 1024, MG_CLOSED, CKPT_NEW, SAME, MG_GROUP_OPTIM,   \
      "keep the embeddings and the first N blocks fixed: no update and no gradient work for them " \
      "(needs --init; at most the model's layers)")                                                \
    X(ema, ema, F64, "ema", "DECAY", 0, 0, MG_EMA_MAX, MG_CLOSED, CKPT_NEW, SAME, MG_GROUP_OPTIM,  \
      "also keep an exponential moving average of the parameters with this decay (0 = off; e.g. "  \
      "0.999 averages about the last 1,000 steps); the checkpoint holds both; the other commands " \
      "and --init use the average (sample and score --raw-weights: the last step's)")              \
    X(seed, seed, U64, "seed", "N", 1, 0, 0, MG_CLOSED, CKPT, SAME, MG_GROUP_RUN,                  \
      "init, split, shuffle and dropout seed, decimal in [0, 2^64)")                               \
    X(dtype, dtype, STR, "dtype", "fp32|bf16", "fp32", 0, 0, MG_CLOSED, CKPT_NEW, SAME,            \
      MG_GROUP_RUN,                                                                                \
      "the dense products' operands: fp32, or bf16 with fp32 accumulation (mixed precision: fp32 " \
      "master weights, optimizer state, LayerNorm, attention, softmax and loss; faster on "        \
      "AVX512_BF16)")                                                                              \
    X(threads, threads, INT, "threads", "N", 0, 0, MG_MAX_THREADS, MG_CLOSED, RUN, NEW,            \
      MG_GROUP_RUN,                                                                                \
      "threads (0 = ATTN_NUM_THREADS, else all cores); --resume continues bit for bit with the "   \
      "same count")                                                                                \
    X(val_every, val_every, INT, "val-every", "N", -1, -1, INT32_MAX, MG_CLOSED, CKPT, NEW,        \
      MG_GROUP_RUN,                                                                                \
      "validation every N steps (0 = at the end only; -1 = about 10 per run, at most 5% of a "     \
      "time-limited run; with --init once per epoch of the training split, at most a tenth of "    \
      "the run apart)")                                                                            \
    X(val_max, val_max, INT, "val-max", "N", 2000, 0, INT32_MAX, MG_CLOSED, CKPT, NEW,             \
      MG_GROUP_RUN, "validation molecules used (0 = all)")                                         \
    X(ckpt_every, ckpt_every, INT, "ckpt-every", "N", 1000, 0, INT32_MAX, MG_CLOSED, CKPT, NEW,    \
      MG_GROUP_RUN, "periodic checkpoint every N steps (0 = off)")                                 \
    X(keep, keep, STR, "keep", "best|last", NULL, 0, 0, MG_CLOSED, CKPT_NEW, NEW, MG_GROUP_RUN,    \
      "what --out holds: best = the state of the step with the lowest validation loss (of the "    \
      "scheduled validations; default with --init; a periodic checkpoint too, so that a resume "   \
      "continues from it), last = the last step's (default otherwise)")                            \
    X(patience, patience, INT, "patience", "N", -1, -1, INT32_MAX, MG_CLOSED, CKPT_NEW, NEW,       \
      MG_GROUP_RUN,                                                                                \
      "stop once N validations in a row have not improved on the best (needs --keep best; 0 = "    \
      "never; -1 = 5 with --keep best, else 0)")                                                   \
    X(check_samples, check_samples, INT, "check-samples", "N", -1, -1, 1000000, MG_CLOSED, RUN,    \
      NEW, MG_GROUP_RUN,                                                                           \
      "at the end, sample N molecules (seed 1, temperature 1) from the kept step's parameters "    \
      "and "                                                                                       \
      "report how many pass the syntax check and how many copy a molecule of the data file as "    \
      "written (0 = no check; -1 = 500 with --init, else 0)")                                      \
    X(progress, progress, FLAG, "no-progress", "", 1, 0, 1, MG_CLOSED, RUN, NEW, MG_GROUP_RUN,     \
      "no progress line (validation lines only)")                                                  \
    X(quiet, quiet, FLAG, "quiet", "", 0, 0, 1, MG_CLOSED, RUN, NEW, MG_GROUP_RUN,                 \
      "print nothing on stderr except errors")                                                     \
    X(stop_after, stop_after, I64, "stop-after", "N", 0, 0, MG_STEPS_MAX, MG_CLOSED, RUN, NEW,     \
      MG_GROUP_TEST, "stop (and checkpoint) once N steps are done (0 = never)")                    \
    X(dump_rows, dump_rows, STR, "debug-dump-rows", "FILE", NULL, 0, 0, MG_CLOSED, RUN, NEW,       \
      MG_GROUP_TEST,                                                                               \
      "append every training row as trained (step, data line, SMILES; tab-separated) to FILE")     \
    X(no_causal_mask, model.no_causal_mask, FLAG, "debug-no-causal-mask", "", 0, 0, 1, MG_CLOSED,  \
      MODEL, SAME, MG_GROUP_TEST,                                                                  \
      "build attention WITHOUT the causal mask: the causal-leak guard must refuse to train it")    \
    X(skip_guard, skip_guard, FLAG, "no-guard", "", 0, 0, 1, MG_CLOSED, RUN, NEW, MG_GROUP_TEST,   \
      "skip the causal-leak guard")                                                                \
    X(loss_log, loss_log, STR, "loss-log", "FILE", NULL, 0, 0, MG_CLOSED, RUN, NEW, MG_GROUP_TEST, \
      "append one line per step to FILE: step, loss, target tokens, gradient norm, a hash of "     \
      "the batch's rows")

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ a run's settings */

/* What a run reports while it trains, through mg_train_log.progress: after
 * every step (the caller decides how often to draw it). */
typedef struct {
    int64_t step;          /* steps done */
    int64_t total_steps;   /* the schedule's; 0 while a time-limited one is sized */
    double loss;           /* training loss, smoothed (EMA 0.9) */
    double val_loss;       /* the last validation (NAN: none yet) */
    double tokens_per_sec; /* non-pad target tokens per second of timed steps */
    double elapsed;        /* seconds since the run started */
    double eta;            /* seconds left (NAN: not known yet) */
    int last;              /* 1 on the run's last step */
} mg_train_progress;

/* Callbacks (any may be NULL): message gets every line a run has to say
 * (the data report, the model, validations, notes, the end; no trailing
 * newline; the data report spans several lines); progress as above. */
typedef struct {
    void (*message)(void *user, const char *text);
    void (*progress)(void *user, const mg_train_progress *p);
    void *user;
} mg_train_log;

/* The settings' C types (kind column of train_settings.h). */
#define MG_CTYPE_STR const char *
#define MG_CTYPE_INT int
#define MG_CTYPE_I64 int64_t
#define MG_CTYPE_U64 uint64_t
#define MG_CTYPE_F64 double
#define MG_CTYPE_F32 float
#define MG_CTYPE_FLAG int
/* A field of its own for RUN and CKPT settings; MODEL and OPTIM ones set a
 * member of model / optim. */
#define MG_DECL_RUN(ctype, field) ctype field;
#define MG_DECL_CKPT(ctype, field) ctype field;
#define MG_DECL_CKPT_NEW(ctype, field) ctype field;
#define MG_DECL_MODEL(ctype, field)
#define MG_DECL_OPTIM(ctype, field)
#define MG_TRAIN_DECL(key, field, kind, cli, arg, def, lo, hi, bounds, save, resume, group, help)  \
    MG_DECL_##save(MG_CTYPE_##kind, field)

/* The number of settings as a constant expression. */
#define MG_TRAIN_COUNT_ONE(...) +1
enum { MG_TRAIN_SETTING_COUNT = 0 MG_TRAIN_SETTINGS(MG_TRAIN_COUNT_ONE) };

typedef struct {
    /* model: vocab_size is always the data's. optim: eps is the default's,
     * total_steps comes from steps (or the time-limit estimate). */
    mg_model_config model;
    mg_adamw_config optim;
    MG_TRAIN_SETTINGS(MG_TRAIN_DECL)
    /* 1: the setting of that index of MG_TRAIN_SETTING was given (the
     * command line marks them; all 0 by default). With --init a MODEL
     * setting given must equal MODEL's (dropout excepted). */
    unsigned char given[MG_TRAIN_SETTING_COUNT];
    mg_train_log log;
    /* The ranks training together (NULL: this process alone). Every rank
     * runs mg_train_run with the same config; each global batch is split
     * by index (consecutive rows in rank order, mg_dist_range), the gradients summed
     * (weighted by the ranks' target tokens: the gradient of the global
     * mean loss), so every rank takes the same AdamW step on the same
     * parameters; validation is split the same way; messages, progress and
     * checkpoints come from rank 0. A failure on any rank ends every rank's
     * run (MG_ERR_PEER on the others). */
    mg_dist *dist;
} mg_train_config;

/* Every setting at its default (train_settings.h; model and optimizer:
 * mg_model_config_default, mg_adamw_config_default), no callbacks. */
void mg_train_config_default(mg_train_config *c);
/* Every setting within its range (a resumed run also checks the ones it
 * takes from the checkpoint when it reads them). */
mg_status mg_train_config_check(const mg_train_config *c, mg_error *err);

/* ------------------------------------------------------------ the table */

/* The lines above as rows of option_table.h, for the code that treats them
 * alike (the command line and --help: cli_options.h; the checkpoint's
 * "train" JSON: checkpoint.c; resume: train.c). */
extern const mg_setting MG_TRAIN_SETTING[];
extern const size_t MG_TRAIN_NUM_SETTINGS;
/* NULL if no setting has that key. */
const mg_setting *mg_setting_find(const char *key);

#ifdef __cplusplus
}
#endif
#endif /* MG_TRAIN_SETTINGS_H */
