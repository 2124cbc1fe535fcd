#!/usr/bin/python3
"""Does fine-tuning generalise? A focused series, a hidden held-out part of
it, and what `molgen train --init` makes of the rest.

    finetune_eval.py run --smarts S --out DIR [--n-focus 500] [--n-heldout 200]
        [--variant NAME 'TRAIN OPTIONS'] ... [--steps 300] [-n 2000]
      1. every molecule of moses_176k.smi that RDKit parses and that contains
         S, shuffled (--seed), split into DIR/focus.smi (the fine-tuning set)
         and DIR/heldout.smi (never given to training; no molecule of it is
         in the focus set, compared as RDKit canonical SMILES);
      2. for each variant: molgen train --init BASE --data DIR/focus.smi
         --steps STEPS --out DIR/NAME.safetensors OPTIONS (the summary line
         kept in DIR/NAME.json, stderr in DIR/NAME.log);
      3. the base model and each variant: mean NLL (nats, summed over a
         molecule's tokens, `molgen score`) of the held-out molecules; N
         samples (seed 7, temperature 1): validity, the series' share (of all
         samples), the share of the valid samples that copy a focus molecule
         and the novelty of the distinct valid ones against the focus set
         (both by canonical SMILES), uniqueness;
      prints a table and writes DIR/results.json.
    finetune_eval.py eval --model M --focus F --heldout H --smarts S [-n N]
      step 3 for one model.

A variant with no options runs molgen's defaults. Needs RDKit (use
/usr/bin/python3). MOLGEN (default build/molgen/molgen) is the binary."""
import argparse
import csv
import json
import os
import random
import shlex
import subprocess
import sys
import time

try:
    from rdkit import Chem, RDLogger
except ImportError:
    sys.exit("finetune_eval.py: needs RDKit (apt-get install python3-rdkit; use /usr/bin/python3)")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOLGEN = os.environ.get("MOLGEN", os.path.join(REPO, "build", "molgen", "molgen"))
BASE = os.path.join(REPO, "models", "molgen-moses.safetensors")
DATA = os.environ.get("MOLGEN_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
ENV = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
           OMP_WAIT_POLICY="PASSIVE")


def canon(s):
    m = Chem.MolFromSmiles(s) if s else None
    return Chem.MolToSmiles(m) if m is not None and m.GetNumAtoms() > 0 else None


def molgen(args, **kw):
    p = subprocess.run([MOLGEN] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                       universal_newlines=True, **kw)
    if p.returncode != 0:
        sys.exit("finetune_eval.py: molgen %s failed (%d): %s"
                 % (args[0], p.returncode, p.stderr.strip()[-2000:]))
    return p


def prep(smarts, n_focus, n_heldout, seed, out):
    pat = Chem.MolFromSmarts(smarts)
    if pat is None:
        sys.exit("finetune_eval.py: cannot parse SMARTS %r" % smarts)
    hits, seen = [], set()
    with open(os.path.join(DATA, "moses_176k.smi")) as f:
        for line in f:
            s = line.split()[0] if line.strip() else ""
            m = Chem.MolFromSmiles(s) if s else None
            if m is None or not m.HasSubstructMatch(pat):
                continue
            c = Chem.MolToSmiles(m)
            if c not in seen:  # one line per molecule: focus and held-out stay disjoint
                seen.add(c)
                hits.append(s)
    if len(hits) < n_focus + n_heldout:
        sys.exit("finetune_eval.py: %d molecules contain %s, fewer than %d + %d"
                 % (len(hits), smarts, n_focus, n_heldout))
    random.Random(seed).shuffle(hits)
    paths = os.path.join(out, "focus.smi"), os.path.join(out, "heldout.smi")
    for path, part in zip(paths, (hits[:n_focus], hits[n_focus:n_focus + n_heldout])):
        with open(path, "w") as f:
            f.write("".join(s + "\n" for s in part))
    return len(hits), paths


def evaluate(model, focus, heldout, smarts, n, workdir, name):
    pat = Chem.MolFromSmarts(smarts)
    rows = list(csv.DictReader(
        molgen(["score", "--model", model, "--smiles", heldout]).stdout.splitlines()))
    ok = [r for r in rows if r["status"] == "ok"]
    smp = os.path.join(workdir, "samples_%s.smi" % name)
    molgen(["sample", "--model", model, "-n", str(n), "--seed", "7", "--out", smp])
    with open(smp) as f:
        samples = [line.split()[0] if line.strip() else "" for line in f][:n]
    with open(focus) as f:
        focus_set = {canon(line.split()[0]) for line in f if line.strip()}
    valid, series, copies = [], 0, 0
    for s in samples:
        c = canon(s)
        if c is None:
            continue
        valid.append(c)
        series += Chem.MolFromSmiles(c).HasSubstructMatch(pat)
        copies += c in focus_set
    distinct = set(valid)
    return {
        "model": model,
        "heldout_scored": len(ok),
        "heldout_mean_nll": sum(float(r["nll"]) for r in ok) / max(len(ok), 1),
        "heldout_nll_per_token": sum(float(r["nll_per_token"]) for r in ok) / max(len(ok), 1),
        "samples": len(samples),
        "validity": len(valid) / max(len(samples), 1),
        "series_share": series / max(len(samples), 1),
        "copy_share": copies / max(len(valid), 1),
        "novelty": len(distinct - focus_set) / max(len(distinct), 1),
        "uniqueness": len(distinct) / max(len(valid), 1),
    }


def run(a):
    os.makedirs(a.out, exist_ok=True)
    total, (focus, heldout) = prep(a.smarts, a.n_focus, a.n_heldout, a.seed, a.out)
    print("%s: %d distinct molecules of moses_176k.smi contain it; %d fine-tuning, %d held out"
          % (a.smarts, total, a.n_focus, a.n_heldout), flush=True)
    results = {"smarts": a.smarts, "focus": focus, "heldout": heldout,
               "base": evaluate(BASE, focus, heldout, a.smarts, a.n, a.out, "base")}
    for name, opts in a.variant or [("defaults", "")]:
        out = os.path.join(a.out, name + ".safetensors")
        cmd = ["train", "--init", BASE, "--data", focus, "--steps", str(a.steps), "--out", out,
               "--no-progress"] + shlex.split(opts)
        t0 = time.time()
        p = molgen(cmd)
        with open(os.path.join(a.out, name + ".log"), "w") as f:
            f.write(p.stderr)
        summary = json.loads(p.stdout.strip().splitlines()[-1])
        r = evaluate(out, focus, heldout, a.smarts, a.n, a.out, name)
        r.update(command="molgen " + " ".join(shlex.quote(x) for x in cmd),
                 seconds=round(time.time() - t0, 1), summary=summary)
        results[name] = r
        print("%s: step %s kept %s (%s), %.0f s" % (name, summary["step"], summary["kept_step"],
                                                   summary["stop"], r["seconds"]), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    b = results["base"]
    print("| model | steps run / kept | held-out mean NLL | NLL/token | validity | series share "
          "(x base) | copies of the focus set (valid) | novelty | uniqueness |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ["base"] + [v[0] for v in a.variant or [("defaults", "")]]:
        r = results[name]
        s = r.get("summary")
        print("| %s | %s | %.2f | %.4f | %.3f | %.3f (%.1fx) | %.3f | %.3f | %.3f |"
              % (name, "%s / %s" % (s["step"], s["kept_step"]) if s else "-",
                 r["heldout_mean_nll"], r["heldout_nll_per_token"], r["validity"],
                 r["series_share"], r["series_share"] / max(b["series_share"], 1e-9),
                 r["copy_share"], r["novelty"], r["uniqueness"]))


def main():
    RDLogger.DisableLog("rdApp.*")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run", help="series, held-out split, fine-tuning variants, evaluation")
    r.add_argument("--smarts", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--n-focus", type=int, default=500)
    r.add_argument("--n-heldout", type=int, default=200)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--steps", type=int, default=300)
    r.add_argument("-n", type=int, default=2000, help="samples per model")
    r.add_argument("--variant", nargs=2, action="append", metavar=("NAME", "OPTIONS"))
    e = sub.add_parser("eval", help="one model")
    e.add_argument("--model", required=True)
    e.add_argument("--focus", required=True)
    e.add_argument("--heldout", required=True)
    e.add_argument("--smarts", required=True)
    e.add_argument("-n", type=int, default=2000)
    e.add_argument("--workdir", default=".")
    a = ap.parse_args()
    if a.mode == "run":
        run(a)
    else:
        print(json.dumps(evaluate(a.model, a.focus, a.heldout, a.smarts, a.n, a.workdir,
                                  os.path.basename(a.model).split(".")[0]), indent=1))


if __name__ == "__main__":
    main()
