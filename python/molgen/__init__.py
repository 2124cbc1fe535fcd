"""molgen's Python side: the tools around the `molgen` binary (a SMILES
transformer on libattn). Each module is imported on its own (no module here
imports torch or RDKit until it is used) and the runnable ones take the
command line of `python3 -m molgen.NAME --help`:

    molgen.metrics           MOSES metrics of a sample file (RDKit, numpy)
    molgen.props             per-molecule properties to CSV (logP, QED, SA, TPSA, MW, scaffold)
    molgen.pictures          SVG histograms of conditioned samples over the data's
    molgen.randomize_smiles  randomized SMILES for `molgen train --augment randomized`
    molgen.motif_set         molecules with a SMARTS motif (fine-tuning sets) and its share
    molgen.cond_eval         the conditional model's evaluation (runs `molgen sample`)
    molgen.torch_model       the model in PyTorch (the C model's twin): bench, loss
    molgen.torch_sample      the PyTorch baseline sampler (no cache, or --kv)
    molgen.scoring           the scorer of `molgen optimize` (TOML components; the PMO oracles)
    molgen.pmo               PMO's AUC top-k of an optimize run's scored.csv
    molgen.report            DIR/report.html of an optimize run (curves, best molecules, scaffolds)
    molgen.torch_reinvent    the same RL in PyTorch on the twin (the same-prior baseline)

numpy, RDKit and PyTorch come from the system (Debian python3-numpy,
python3-rdkit, python3-torch); nothing is fetched.
"""
