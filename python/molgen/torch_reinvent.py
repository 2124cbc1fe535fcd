"""The same-prior PyTorch baseline of `molgen optimize`: REINVENT's DAP on
molgen's prior through the PyTorch twin (molgen.torch_model) and its KV-cache
sampler (molgen.torch_sample), against the same scorer protocol.

    /usr/bin/python3 -m molgen.torch_reinvent --prior MODEL --scorer 'COMMAND'
        [--budget 10000] [--seed 0] --out DIR [--batch 64] [--sigma 128]
        [--lr 1e-4] [--df scaffold|smiles|none] [--df-bucket 25]
        [--df-min-score 0.4] [--repeat-penalty 0.5] [--memory 50] [--replay 10]
        [--rank-coef 0] [--replay-loops 0] [--ga-offspring 0] [--patience 0]
        [--max-steps 0] [--threads 1] [--timeout 60]

The algorithm is molgen/rl/optimize.h's, step by step (its defaults):
  1. sample --batch molecules from the agent (the twin's KV cache; no
     constrained decoding here: molgen's --constrain has no Python twin);
  2. a row that ends without EOS or cannot be encoded is no loss row; a
     molecule the scorer answers `nan` is invalid (score 0, no call); the
     cache key is the scorer's canonical= (else the SMILES); each new key
     is one call of the budget; molecules past the budget are left out;
  3. learning score s': the score; 0 for an in-batch duplicate; times
     --repeat-penalty for a molecule first scored in an earlier step; 0 when
     its diversity-filter bucket (the scorer's scaffold=, else the canonical
     SMILES) holds more than --df-bucket molecules scored >= --df-min-score;
  4. loss = mean over the loss rows and --replay rows drawn from the
     inception memory (the --memory best distinct molecules by s', with
     their prior NLL) of (prior_ll + sigma s' - agent_ll)^2 (ll: the summed
     log-likelihood of the tokens after BOS, EOS included); one Adam step
     (lr, betas 0.9/0.999, eps 1e-8, no decay, no clipping). The replay
     rows are drawn alike, or by rank with --rank-coef C (weight
     1 / (C n + rank) over the n memory entries, without replacement);
  5. --replay-loops L: L more Adam steps, each on --replay rows drawn afresh
     from the memory as it stands after the step (Genetic GFN's loop).
The run ends at the budget, after --max-steps, on mode collapse (the share
of a batch new to the cache below 0.02 for 20 steps) or with --patience K
after K steps in a row that left the mean of the 100 best scores unchanged,
counted past 1,000 calls once 100 molecules scored above 0 (molgen
optimize's rule). Left out: molgen's --constrain (the agent samples
unconstrained), --augmented-memory and the DAP's multi-process split. It
writes DIR/scored.csv (molgen optimize's columns), DIR/best.smi,
DIR/summary.json and DIR/agent.safetensors (loads in molgen sample).
"""
import argparse
import csv
import json
import math
import os
import random
import select
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from molgen import graph_ga
from molgen import pmo
from molgen import torch_model as tm
from molgen import torch_sample as ts


# --patience counts a step only past this many calls and hits (molgen
# optimize's rule: mol_opt's 1,000 calls; 100 molecules above 0)
PLATEAU_CALLS, PLATEAU_HITS = 1000, 100


class ScorerError(Exception):
    pass


class Scorer:
    """molgen's scorer protocol, client side: COMMAND under /bin/sh -c; one
    SMILES per line in, one `SCORE[\\tNAME=VALUE]...` line out per SMILES."""

    def __init__(self, command, timeout=60.0, env=None):
        self.command, self.timeout = command, timeout
        self.p = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, bufsize=0, env=env)
        self.buf = b""

    def _line(self, smiles):
        fd = self.p.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], self.timeout)
            if not ready:
                raise ScorerError("scorer gave no answer for %r within %g s" % (smiles, self.timeout))
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ScorerError("scorer exited (status %s) before answering %r"
                                  % (self.p.poll(), smiles))
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace").rstrip("\r")

    def score(self, smiles_list):
        """-> [{'valid', 'score', 'canonical', 'scaffold', 'comps'}] in order."""
        try:
            self.p.stdin.write("".join(s + "\n" for s in smiles_list).encode())
            self.p.stdin.flush()
        except BrokenPipeError:
            raise ScorerError("scorer closed its input (status %s)" % self.p.poll())
        out = []
        for smi in smiles_list:
            line = self._line(smi)
            fields = line.split("\t")
            try:
                v = float(fields[0])
            except ValueError:
                raise ScorerError("scorer line %r for %r: not a number" % (line, smi))
            r = {"valid": not math.isnan(v), "score": 0.0 if math.isnan(v) else v,
                 "canonical": None, "scaffold": None, "comps": []}
            if r["valid"] and not 0.0 <= v <= 1.0:
                raise ScorerError("scorer line %r for %r: score outside [0, 1]" % (line, smi))
            for f in fields[1:]:
                name, eq, val = f.partition("=")
                if not eq:
                    continue
                if name in ("canonical", "scaffold"):
                    r[name] = val
                else:
                    try:
                        float(val)
                        r["comps"].append("%s=%s" % (name, val))
                    except ValueError:
                        pass
            out.append(r)
        return out

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()


def encode(smiles, index, T):
    """SMILES -> token ids BOS .. EOS (<= T of them), or None (a token outside
    the vocabulary, too long, empty)."""
    try:
        toks = tm.tokenize(smiles)
    except ValueError:
        return None
    if not toks or len(toks) + 2 > T or any(t not in index for t in toks):
        return None
    return [tm.BOS] + [index[t] for t in toks] + [tm.EOS]


def rows_nll(model, rows):
    """Summed NLL of each row's targets (tokens after BOS, EOS included): [n]."""
    L = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), L), dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    logits = model.logits(ids[:, :-1], lengths - 1)
    ce = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    mask = torch.arange(L - 1)[None, :] < (lengths - 1)[:, None]
    return (ce * mask).sum(dim=1)


class Run:
    def __init__(self, a):
        self.a = a
        self.prior, self.vocab = tm.load_model(a.prior, torch.float32)
        self.agent, _ = tm.load_model(a.prior, torch.float32)
        if self.vocab is None:
            raise ValueError("%s has no vocab" % a.prior)
        self.prior.eval()
        self.agent.eval()  # dropout 0: eval and train are the same forward
        for p in self.prior.parameters():
            p.requires_grad_(False)
        self.index = {t: i for i, t in enumerate(self.vocab)}
        self.T = self.prior.cfg.ctx_len + 1
        self.opt = torch.optim.Adam(self.agent.parameters(), lr=a.lr, betas=(0.9, 0.999),
                                    eps=1e-8)
        self.gen = torch.Generator().manual_seed(a.seed)
        self.rng = random.Random(a.seed)
        self.mols = []        # scored molecules, call order
        self.by_key = {}      # canonical -> index
        self.raw = {}         # sampled spelling / canonical -> index, -1 invalid
        self.bucket = {}      # diversity-filter key -> molecules scored >= min
        self.memory = []      # [(s', index)] best first
        self.step = 0
        self.ga_calls = 0     # calls spent on GA offspring
        self.reason = ""
        self.updates = 0  # Adam steps

    def bucket_key(self, m):
        if self.a.df == "scaffold" and m["scaffold"]:
            return m["scaffold"]
        return m["canonical"]

    def score_batch(self, smiles, gi):
        """Scores the pending rows' molecules within the budget: new molecules
        [dicts], gi updated in place (index, -1 invalid, None past the budget)."""
        pend = []
        for i, s in enumerate(smiles):
            if gi[i] == "pending" and s not in pend:
                pend.append(s)
        new, sent = [], 0
        while sent < len(pend):
            left = self.a.budget - len(self.mols) - len(new)
            if left <= 0:
                break
            chunk = pend[sent:sent + left]
            for smi, r in zip(chunk, self.scorer.score(chunk)):
                g = -1
                if r["valid"]:
                    key = r["canonical"] or smi
                    if key in self.by_key:
                        g = self.by_key[key]
                    else:
                        g = next((len(self.mols) + q for q, m in enumerate(new)
                                  if m["canonical"] == key), None)
                    if g is None:
                        g = len(self.mols) + len(new)
                        new.append({"smiles": smi, "canonical": key, "scaffold": r["scaffold"],
                                    "comps": ";".join(r["comps"]), "score": r["score"],
                                    "step": self.step, "call": g + 1,
                                    "prior_nll": float("nan"), "agent_nll": float("nan")})
                for i, s in enumerate(smiles):
                    if gi[i] == "pending" and s == smi:
                        gi[i] = g
            sent += len(chunk)
        for i in range(len(gi)):
            if gi[i] == "pending":
                gi[i] = None
        return new

    def mol(self, g, new):
        return self.mols[g] if g < len(self.mols) else new[g - len(self.mols)]

    def step_once(self):
        a, B = self.a, self.a.batch
        ids, ended, _ = ts.sample(self.agent, B, B, 1.0, 0, 1.0, self.gen, kv=True)
        smiles = ["".join(self.vocab[t] for t in row) for row in ids]
        rows, gi = [], []
        for s, e in zip(smiles, ended):
            r = encode(s, self.index, self.T) if e else None
            rows.append(r)
            if r is None:
                gi.append(None)
            elif s in self.raw:
                gi.append(self.raw[s])
            else:
                gi.append("pending")
        new = self.score_batch(smiles, gi)
        n_old = len(self.mols)
        # learning scores
        s1, s2 = [0.0] * B, [0.0] * B
        for i in range(B):
            if gi[i] is None or gi[i] < 0:
                continue
            m = self.mol(gi[i], new)
            s1[i] = s2[i] = m["score"]
            if gi[i] in gi[:i]:
                s2[i] = 0.0
                continue
            if gi[i] < n_old:
                s2[i] *= a.repeat_penalty
            if a.df != "none" and m["score"] >= a.df_min_score:
                bk = self.bucket_key(m)
                count = self.bucket.get(bk, 0) + sum(
                    1 for q in new if q["score"] >= a.df_min_score and self.bucket_key(q) == bk)
                if count > a.df_bucket:
                    s2[i] = 0.0
        # replay rows from the memory before this step
        replay = self.draw_memory()
        use = [i for i in range(B) if rows[i] is not None]
        loss_rows = [rows[i] for i in use] + [
            encode(self.mols[g]["smiles"], self.index, self.T) for _, g in replay]
        with torch.no_grad():
            pn = rows_nll(self.prior, [rows[i] for i in use]).tolist() if use else []
        prior_nll = pn + [self.mols[g]["prior_nll"] for _, g in replay]
        score2 = [s2[i] for i in use] + [s for s, _ in replay]
        # new molecules and the memory
        self.add_scored(new)
        for i in range(B):
            if gi[i] is not None and rows[i] is not None:
                self.raw[smiles[i]] = gi[i]
        self.remember([(s2[i], gi[i]) for i in range(B) if gi[i] is not None and gi[i] >= 0
                       and s2[i] > 0 and rows[i] is not None])
        # GA offspring of the best molecules so far (off-policy rows)
        if a.ga_offspring:
            rows_g, pn_g, s_g = self.ga_rows()
            if a.ga_train:
                loss_rows += rows_g
                prior_nll += pn_g
                score2 += s_g
        # the DAP update
        loss = 0.0
        if loss_rows:
            loss, agent_nll = self.dap_step(loss_rows, prior_nll, score2)
            for k, i in enumerate(use):
                g = gi[i]
                if g is not None and g >= n_old and math.isnan(self.mols[g]["prior_nll"]):
                    self.mols[g]["prior_nll"] = pn[k]
                    self.mols[g]["agent_nll"] = float(agent_nll[k])
        # Genetic GFN's experience loop on the memory as the step left it
        for _ in range(a.replay_loops):
            rep = self.draw_memory()
            if not rep:
                break
            self.dap_step([encode(self.mols[g]["smiles"], self.index, self.T) for _, g in rep],
                          [self.mols[g]["prior_nll"] for _, g in rep], [s for s, _ in rep])
        self.step += 1
        valid = sum(1 for g in gi if g is not None and g >= 0)
        uniq = len({g for g in gi if g is not None and g >= 0})
        return {"mean": sum(s1) / B, "valid": valid / B, "unique": uniq / B,
                "fresh": len(new) / B, "loss": loss}

    def add_scored(self, new):
        """New scored molecules into the store, the cache keys and the
        diversity filter's buckets (the agent's and the GA's alike)."""
        a = self.a
        for q in new:
            self.mols.append(q)
            self.by_key[q["canonical"]] = q["call"] - 1
            self.raw[q["smiles"]] = self.raw[q["canonical"]] = q["call"] - 1
            if a.df != "none" and q["score"] >= a.df_min_score:
                bk = self.bucket_key(q)
                self.bucket[bk] = self.bucket.get(bk, 0) + 1

    def draw_memory(self):
        """min(--replay, memory) distinct memory entries: alike, or by rank
        (best first) with --rank-coef, as molgen/rl/optimize.c draws them."""
        a, mem = self.a, self.memory
        k = min(a.replay, len(mem))
        if not k:
            return []
        if a.rank_coef <= 0:
            return self.rng.sample(mem, k)
        n = len(mem)
        w = [1.0 / (a.rank_coef * n + r) for r in range(n)]
        out = []
        for _ in range(k):
            u, pick = self.rng.random() * sum(w), -1
            for r in range(n):
                if w[r] <= 0:
                    continue
                pick = r
                u -= w[r]
                if u < 0:
                    break
            out.append(mem[pick])
            w[pick] = 0.0
        return out

    def dap_step(self, rows, prior_nll, scores):
        """One Adam step on loss = mean (prior_ll + sigma s - agent_ll)^2 over
        the rows; returns (loss, the rows' agent NLLs)."""
        agent_nll = rows_nll(self.agent, rows)
        tgt = torch.tensor([-p + self.a.sigma * s for p, s in zip(prior_nll, scores)])
        d = tgt + agent_nll  # target - agent_ll
        L = (d * d).mean()
        self.opt.zero_grad(set_to_none=True)
        L.backward()
        self.opt.step()
        self.updates += 1
        return float(L), agent_nll

    def remember(self, entries):
        """(s', molecule) entries into the inception memory: distinct
        molecules, best first (ties by molecule), the --memory best kept."""
        mem = list(self.memory)
        for e in entries:
            if all(g != e[1] for _, g in mem):
                mem.append(e)
        mem.sort(key=lambda e: (-e[0], e[1]))
        self.memory = mem[:self.a.memory]

    def ga_rows(self):
        """Genetic GFN's exploration step (Kim et al. 2024) as molgen's
        --ga-offspring does it: 2G parents drawn with replacement from the
        --ga-pool best scored molecules, weight 1 / (1e-3 K + rank); one
        child per pair (molgen.graph_ga: crossover, then a mutation with
        probability --ga-mutation); children the prior can spell and the
        cache has not seen are scored (each a call) and join the memory and
        this step's loss rows with their prior NLL."""
        a = self.a
        order = sorted(range(len(self.mols)), key=lambda g: (-self.mols[g]["score"], g))
        pool = order[:a.ga_pool]
        if len(pool) < 2:
            return [], [], []
        w = [1.0 / (1e-3 * len(pool) + r) for r in range(len(pool))]
        par = self.rng.choices(pool, weights=w, k=2 * a.ga_offspring)
        kids = []
        for i in range(a.ga_offspring):
            rng = random.Random((a.seed * 1000003 + self.step) * 1000003 + i)
            c = graph_ga.reproduce(self.mols[par[2 * i]]["smiles"],
                                   self.mols[par[2 * i + 1]]["smiles"], rng, a.ga_mutation)
            if c and c not in self.raw and c not in kids and encode(c, self.index, self.T):
                kids.append(c)
        if not kids:
            return [], [], []
        gi = ["pending"] * len(kids)
        new = self.score_batch(kids, gi)
        self.ga_calls += len(new)
        if not new:      # the budget is spent, or every child was a repeat
            return [], [], []
        self.add_scored(new)
        rows = [encode(self.mols[q["call"] - 1]["smiles"], self.index, self.T) for q in new]
        with torch.no_grad():
            pn = rows_nll(self.prior, rows).tolist()
        for q, p in zip(new, pn):
            q["prior_nll"] = p
        self.remember([(q["score"], q["call"] - 1) for q in new if q["score"] > 0])
        return rows, pn, [q["score"] for q in new]

    def top_mean(self, n):
        s = sorted((m["score"] for m in self.mols), reverse=True)[:n]
        return sum(s) / len(s) if s else 0.0

    def run(self):
        a = self.a
        os.makedirs(a.out, exist_ok=True)
        self.scorer = Scorer(a.scorer, a.timeout)
        t0 = time.perf_counter()
        collapse = plateau = 0
        try:
            while True:
                top100 = self.top_mean(100) if a.patience else 0.0
                pg = self.step_once()
                if a.patience:  # the top 100 sorted only when the stop is on
                    hits = sum(1 for m in self.mols if m["score"] > 0)
                    plateau = plateau + 1 if (len(self.mols) > PLATEAU_CALLS and
                                              hits >= PLATEAU_HITS and
                                              self.top_mean(100) == top100) else 0
                el = time.perf_counter() - t0
                n = len(self.mols)
                eta = el / n * (a.budget - n) if n else float("nan")
                print("step %d: calls %d/%d, mean %.3f, top-10 %.3f, valid %.2f, unique %.2f, "
                      "loss %.1f, %.0f s, ETA %.0f s" % (self.step, n, a.budget, pg["mean"],
                                                         self.top_mean(10), pg["valid"],
                                                         pg["unique"], pg["loss"], el, eta),
                      file=sys.stderr, flush=True)
                collapse = collapse + 1 if pg["fresh"] < 0.02 else 0
                if n >= a.budget:
                    self.reason = "budget"
                elif collapse >= 20:
                    self.reason = "collapse"
                elif a.patience and plateau >= a.patience:
                    self.reason = "patience"
                elif a.max_steps and self.step >= a.max_steps:
                    self.reason = "max-steps"
                if self.reason:
                    break
        finally:
            self.scorer.close()
        self.write(time.perf_counter() - t0)

    def write(self, seconds):
        a = self.a
        with open(os.path.join(a.out, "scored.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["call", "step", "smiles", "canonical", "score", "prior_nll", "agent_nll",
                        "scaffold", "components"])
            for m in self.mols:
                w.writerow([m["call"], m["step"], m["smiles"], m["canonical"], repr(m["score"]),
                            "%.6f" % m["prior_nll"], "%.6f" % m["agent_nll"], m["scaffold"] or "",
                            m["comps"]])
        order = sorted(self.mols, key=lambda m: (-m["score"], m["call"]))
        with open(os.path.join(a.out, "best.smi"), "w") as f:
            for m in order[:100]:
                f.write("%s\t%s\n" % (m["smiles"], repr(m["score"])))
        scores = [m["score"] for m in self.mols]
        opts = {k: getattr(a, k) for k in ("seed", "budget", "batch", "sigma", "lr", "df",
                                           "df_bucket", "df_min_score", "repeat_penalty",
                                           "memory", "replay", "rank_coef", "replay_loops",
                                           "ga_offspring", "ga_pool", "ga_mutation",
                                           "patience")}
        summary = {"engine": "torch", "torch": torch.__version__,
                   "threads": torch.get_num_threads(), "prior": a.prior, "scorer": a.scorer,
                   "calls": len(self.mols), "steps": self.step, "budget": a.budget,
                   "top1": self.top_mean(1), "top10": self.top_mean(10),
                   "top100": self.top_mean(100), "auc_top10": pmo.auc(scores, 10, a.budget),
                   "seconds": seconds, "stop": self.reason, "options": opts,
                   "ga_calls": self.ga_calls, "updates": self.updates}
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        _, meta = tm.load_safetensors(a.prior)
        state = {k: v.detach().numpy() for k, v in self.agent.state_dict().items()}
        tm.save_safetensors(os.path.join(a.out, "agent.safetensors"), state,
                            {k: meta[k] for k in ("format", "config", "vocab") if k in meta})


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m molgen.torch_reinvent",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--prior", required=True)
    ap.add_argument("--scorer", required=True, help="command line of the scorer (sh -c)")
    ap.add_argument("--budget", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sigma", type=float, default=128.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--df", choices=("scaffold", "smiles", "none"), default="scaffold")
    ap.add_argument("--df-bucket", type=int, default=25)
    ap.add_argument("--df-min-score", type=float, default=0.4)
    ap.add_argument("--repeat-penalty", type=float, default=0.5)
    ap.add_argument("--memory", type=int, default=50)
    ap.add_argument("--replay", type=int, default=10)
    ap.add_argument("--rank-coef", type=float, default=0.0,
                    help="replay drawn by rank, weight 1 / (C n + rank) (0: alike)")
    ap.add_argument("--replay-loops", type=int, default=0,
                    help="L more updates a step on --replay memory rows drawn afresh")
    ap.add_argument("--patience", type=int, default=0,
                    help="stop after K steps that left the top-100 mean unchanged (0: never)")
    ap.add_argument("--ga-offspring", type=int, default=0,
                    help="GA children of the best molecules per step (0: off)")
    ap.add_argument("--ga-pool", type=int, default=128, help="the GA's parents: the best K")
    ap.add_argument("--ga-mutation", type=float, default=0.01, help="mutation probability")
    ap.add_argument("--ga-train", type=int, default=1,
                    help="1: the children are loss rows of their step; 0: only the memory")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per scorer answer")
    a = ap.parse_args(argv)
    if a.budget < 1 or a.batch < 1 or a.memory < 0 or not 0 <= a.replay <= a.memory \
            or not 0 <= a.repeat_penalty <= 1 or a.df_bucket < 0 or a.max_steps < 0 \
            or a.threads < 1 or not a.timeout > 0 or not math.isfinite(a.sigma) \
            or not a.lr > 0 or not 0 <= a.rank_coef < math.inf or a.replay_loops < 0 \
            or a.patience < 0 or (a.replay_loops and not a.replay):
        print("molgen.torch_reinvent: bad option value (budget, batch >= 1; 0 <= replay <= "
              "memory; repeat penalty in [0, 1]; lr, timeout > 0; rank coef, replay loops, "
              "patience >= 0; replay loops need replay > 0)", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    try:
        Run(a).run()
    except (OSError, ValueError, KeyError, ScorerError) as e:
        print("molgen.torch_reinvent: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
