"""PyTorch baseline sampler for molgen models, MolGPT's way: every step
re-runs the whole prefix through the model (no KV cache); with --kv, a
KV cache like molgen's (each step runs the new position only, attention
over the cached keys and values of every block).

    /usr/bin/python3 -m molgen.torch_sample [--model FILE | --molgpt] [--kv]
        [-n 256] [--batch 64] [--seed 0] [--temperature 1] [--top-k 0]
        [--top-p 1] [--threads N] [--runs 1] [--warmup 0] [--out FILE] [--json]

The model is molgen.torch_model's twin of model.c, loaded from a molgen
model file / checkpoint (--model), or freshly initialised (default config,
or --molgpt; ctx 54 and the MOSES vocabulary, as `molgen bench` does).
Token choice matches molgen/gen/sample.c: PAD and BOS are never sampled;
temperature 0 is greedy; top-k keeps the k largest logits; top-p keeps the
shortest prefix of the sorted distribution with mass >= p. Generation stops
at EOS or after ctx_len tokens; the batch runs until every row has stopped
(finished rows are still computed, as in MolGPT's sampler and molgen's naive
decoder). Reports molecules/s and tokens/s (the median of --runs timed runs
after --warmup ones) on stderr, or one JSON object on stdout with --json.
The molecules differ from molgen sample's (another RNG); the speed is the
comparison: `molgen bench` / `molgen sample --decode naive|kv` is the C side.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

from molgen import torch_model as tm

MOSES_TOKENS = ["#", "(", ")", "-", "1", "2", "3", "4", "5", "6", "=", "Br", "C", "Cl", "F",
                "N", "O", "S", "[H]", "[nH]", "c", "n", "o", "s"]


def choose(logits, temperature, top_k, top_p, gen):
    """logits [B, V] -> next ids [B] (molgen's rules)."""
    logits = logits.clone()
    logits[:, tm.PAD] = -float("inf")
    logits[:, tm.BOS] = -float("inf")
    if temperature == 0 or top_k == 1:
        return torch.argmax(logits, dim=-1)
    logits = logits / temperature
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -float("inf"))
    probs = torch.softmax(logits.double(), dim=-1)
    if top_p < 1.0:
        sp, si = torch.sort(probs, dim=-1, descending=True)
        cum = torch.cumsum(sp, dim=-1)
        # keep a token while the mass before it is < top_p (at least one)
        drop = (cum - sp) >= top_p
        drop[:, 0] = False
        sp = sp.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def kv_step(model, tok, pos, cache):
    """Logits [nb, V] for tokens tok [nb] at position pos, every row at the
    same position; cache: per block a [k, v] pair of [nb, H, pos, dk]
    tensors (empty lists at pos 0), extended in place. The twin's own
    weights through the same products as its Block.forward."""
    cfg = model.cfg
    H, d = cfg.n_head, cfg.d_model
    dk = d // H
    nb = tok.shape[0]
    x = model.tok_emb(tok) + model.pos_emb.weight[pos]
    for blk, kv in zip(model.blocks, cache):
        h = blk.ln1(x)
        q, k, v = F.linear(h, blk.attn.in_proj_weight, blk.attn.in_proj_bias).split(d, dim=-1)
        q, k, v = (t.reshape(nb, H, 1, dk) for t in (q, k, v))
        if kv:
            kv[0] = torch.cat([kv[0], k], dim=2)
            kv[1] = torch.cat([kv[1], v], dim=2)
        else:
            kv.extend([k, v])
        w = torch.softmax(q @ kv[0].transpose(-1, -2) / math.sqrt(dk), dim=-1)
        a = (w @ kv[1]).reshape(nb, d)
        x = x + blk.attn.out_proj(a)
        x = x + blk.mlp(blk.ln2(x))
    return model.head(model.ln_f(x))


@torch.no_grad()
def sample(model, n, batch, temperature, top_k, top_p, gen, kv=False):
    """-> (list of id lists without BOS/EOS, list of ended flags, tokens)."""
    ctx = model.cfg.ctx_len
    out, ended, tokens = [], [], 0
    for start in range(0, n, batch):
        nb = min(batch, n - start)
        x = torch.full((nb, 1), tm.BOS, dtype=torch.long)
        done = torch.zeros(nb, dtype=torch.bool)
        lens = torch.full((nb,), ctx, dtype=torch.long)
        cache = [[] for _ in model.blocks]
        for pos in range(ctx):
            if kv:  # the new position only
                logits = kv_step(model, x[:, -1], pos, cache)
            else:   # the whole prefix, every step
                logits = model.logits(x)[:, -1, :]
            nxt = choose(logits, temperature, top_k, top_p, gen)
            nxt = torch.where(done, torch.full_like(nxt, tm.EOS), nxt)
            newly = (nxt == tm.EOS) & ~done
            lens[newly] = pos
            done |= newly
            x = torch.cat([x, nxt[:, None]], dim=1)
            if bool(done.all()) or x.shape[1] > ctx:
                break
        for r in range(nb):
            k = int(lens[r])
            out.append(x[r, 1:1 + k].tolist())
            ended.append(bool(done[r]))
            tokens += k + (1 if done[r] else 0)
    return out, ended, tokens


def median(v):
    v = sorted(v)
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.torch_sample',
                                     description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="molgen model file or checkpoint (.safetensors)")
    ap.add_argument("--molgpt", action="store_true",
                    help="fresh MolGPT-size model (8 layers, d 256, 8 heads) instead of the default")
    ap.add_argument("--ctx", type=int, default=54, help="ctx_len of a fresh model (default 54)")
    ap.add_argument("-n", type=int, default=256, help="molecules per run (default 256)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--out", help="write the (last run's) molecules here, one per line")
    ap.add_argument("--kv", action="store_true",
                    help="a KV cache: each step runs the new position only")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.n < 1 or a.batch < 1 or a.runs < 1 or a.warmup < 0 or a.temperature < 0 \
            or a.top_k < 0 or not 0 < a.top_p <= 1:
        print("molgen.torch_sample: bad -n/--batch/--runs/--warmup/--temperature/--top-k/--top-p",
              file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    try:
        if a.model:
            model, vocab = tm.load_model(a.model)
            if vocab is None:
                raise ValueError("%s has no vocab" % a.model)
            name = a.model
        else:
            vocab = tm.SPECIALS + MOSES_TOKENS
            cfg = tm.Config.molgpt(a.ctx, len(vocab)) if a.molgpt else \
                tm.Config(4, 128, 4, a.ctx, len(vocab), 0.0)
            torch.manual_seed(1)
            model = tm.MolGPT(cfg)
            name = "molgpt" if a.molgpt else "default"
    except (OSError, ValueError, KeyError) as e:
        print("molgen.torch_sample: %s" % e, file=sys.stderr)
        return 1
    model.eval()
    if a.kv and not model.cfg.causal:
        print("molgen.torch_sample: --kv needs a causal model (a cache cannot see later tokens)",
              file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(a.seed)
    rates, tok_rates = [], []
    for run in range(a.warmup + a.runs):
        t0 = time.perf_counter()
        ids, ended, tokens = sample(model, a.n, a.batch, a.temperature, a.top_k, a.top_p, gen,
                                     a.kv)
        dt = time.perf_counter() - t0
        if run >= a.warmup:
            rates.append(a.n / dt)
            tok_rates.append(tokens / dt)
    smiles = ["".join(vocab[i] for i in row) for row in ids]
    if a.out:
        d = os.path.dirname(a.out)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(a.out, "w") as f:
            for s in smiles:
                f.write(s + "\n")
    cfg = model.cfg
    res = {"impl": "torch-kv" if a.kv else "torch-naive", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "model": name, "n_layer": cfg.n_layer, "d_model": cfg.d_model, "n_head": cfg.n_head,
           "ctx_len": cfg.ctx_len, "vocab_size": cfg.vocab_size, "n": a.n, "batch": a.batch,
           "runs": a.runs, "molecules_per_s": median(rates), "min": min(rates), "max": max(rates),
           "tokens_per_s": median(tok_rates), "tokens_per_molecule": tokens / a.n,
           "ended": sum(ended)}
    if a.json:
        print(json.dumps(res))
    else:
        print("torch %s, %d threads, %s model (%d layers, d %d, %d heads): sampled %d molecules "
              "(batch %d, %s): %.1f molecules/s [%.1f .. %.1f], "
              "%.0f tokens/s, %.1f tokens/molecule"
              % (torch.__version__, res["threads"], name, cfg.n_layer, cfg.d_model, cfg.n_head,
                 a.n, a.batch, "KV cache" if a.kv else "whole prefix every step",
                 res["molecules_per_s"], res["min"], res["max"],
                 res["tokens_per_s"], res["tokens_per_molecule"]), file=sys.stderr)
        if a.out:
            print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
