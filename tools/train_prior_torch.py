#!/usr/bin/env python3
"""Train a molgen prior with PyTorch, on a GPU when one is lent (or on the
CPU, slowly): the same model as molgen/nn/model.c (python/molgen/torch_model.py,
whose forward `molgen score` agrees with to float rounding, tested in
molgen/tests/nn/test_model_torch.py), written as a molgen model file that
`molgen sample`, `score`, `attention`, `optimize --prior` and `train --init`
read.

Why it exists: molgen trains on the CPU at ~8,000 tokens/s per core; a
prior for ZINC250k wants tens of millions of molecule passes, hours of a
2-core machine. On a lent GPU the same model trains ~100x faster. The data
split is molgen train's own (molgen.split: --val-frac, --seed), so
tools/eval_prior.sh evaluates the result exactly as it does a C-trained one.

    /usr/bin/python3 tools/train_prior_torch.py --data zinc250k_240k.smi \\
        --vocab-from models/molgen-zinc.safetensors --layers 6 --d-model 128 \\
        --heads 4 --ctx-len 160 --dropout 0.1 --time-limit 400 --out A.safetensors

Schedule: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices, clip 1.0),
linear warm-up, then cosine decay to --min-lr-frac over the WALL-CLOCK time
limit (runs sized by time compare at equal wall time). Every --val-every
seconds the full validation split is scored in fp32; the best model so far
is written (atomically) to --out, so a run cut short keeps its best. One
line per validation on stderr: "step S: train loss X, val loss Y (first
2000: Z), lr R, T s".
"""
import argparse
import json
import math
import os
import sys
import time
import zlib

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from molgen.split import split_indices  # noqa: E402
from molgen.torch_model import (Config, MolGPT, SPECIALS, load_safetensors,  # noqa: E402
                                save_safetensors, tokenize)


def read_lines(path):
    import gzip
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        return [ln.split()[0] for ln in f if ln.split()]


def encode_all(smiles, vocab, T):
    """[N, T] int64 rows BOS t.. EOS PAD.., lengths [N]; refuses unknown tokens
    and rows longer than T (never cut)."""
    idx = {t: i for i, t in enumerate(vocab)}
    ids = np.zeros((len(smiles), T), dtype=np.int64)
    lengths = np.zeros(len(smiles), dtype=np.int64)
    for r, s in enumerate(smiles):
        toks = tokenize(s)
        bad = [t for t in toks if t not in idx]
        if bad:
            raise SystemExit("line %d: token %r not in the vocabulary" % (r + 1, bad[0]))
        row = [1] + [idx[t] for t in toks] + [2]
        if len(row) > T:
            raise SystemExit("line %d: %d tokens, longer than the context" % (r + 1, len(row) - 2))
        ids[r, :len(row)] = row
        lengths[r] = len(row)
    return ids, lengths


def fast_logits(model, inp, p, training):
    """model.logits without key padding (rows are right-padded and attention
    is causal, so a real position never sees a pad) through fused SDPA:
    inp [B, L] -> logits [B, L, V]. Same parameters, same function."""
    cfg = model.cfg
    B, L = inp.shape
    H, d = cfg.n_head, cfg.d_model
    x = F.dropout(model.tok_emb(inp) + model.pos_emb.weight[:L][None], p, training)
    for blk in model.blocks:
        h = blk.ln1(x)
        qkv = F.linear(h, blk.attn.in_proj_weight, blk.attn.in_proj_bias)  # [B, L, 3d]
        q, k, v = qkv.view(B, L, 3, H, d // H).permute(2, 0, 3, 1, 4)    # each [B, H, L, D]
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=p if training else 0.0)
        else:  # torch < 2.0
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d // H)
            s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool, device=inp.device), 1),
                              float("-inf"))
            a = F.dropout(torch.softmax(s, -1), p, training) @ v
        a = a.transpose(1, 2).reshape(B, L, d)
        x = x + F.dropout(F.linear(a, blk.attn.out_proj.weight, blk.attn.out_proj.bias), p, training)
        x = x + F.dropout(blk.mlp(blk.ln2(x)), p, training)
    return model.head(model.ln_f(x))


def batch_loss(model, ids, lengths, p, training):
    """Mean cross-entropy over the real targets of rows ids [B, T]."""
    inp, tgt = ids[:, :-1], ids[:, 1:]
    logits = fast_logits(model, inp, p, training)
    mask = torch.arange(inp.shape[1], device=ids.device)[None, :] < (lengths - 1)[:, None]
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                         reduction="none").reshape(tgt.shape)
    return (ce * mask).sum() / mask.sum(), mask.sum()


def val_loss(model, ids, lengths, bs=2000):
    model.eval()
    tot, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, ids.shape[0], bs):
            l, c = batch_loss(model, ids[i:i + bs], lengths[i:i + bs], 0.0, False)
            tot += float(l) * int(c)
            n += int(c)
    model.train()
    return tot / n


def save_model(model, vocab, path, info):
    tensors = {k: v.detach().float().cpu().numpy() for k, v in model.named_parameters()}
    crc = {k: "%08x" % zlib.crc32(np.ascontiguousarray(v).astype("<f4").tobytes())
           for k, v in tensors.items()}
    c = model.cfg
    cfg = {"n_layer": c.n_layer, "d_model": c.d_model, "n_head": c.n_head, "ctx_len": c.ctx_len,
           "vocab_size": c.vocab_size, "dropout": c.dropout, "causal": True}
    save_safetensors(path, tensors, {"format": "molgen", "config": json.dumps(cfg, separators=(",", ":")),
                                     "vocab": json.dumps(vocab, separators=(",", ":")),
                                     "crc32": json.dumps(crc, separators=(",", ":")),
                                     "torch_train": json.dumps(info, separators=(",", ":"))})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help=".smi (or .smi.gz), one molecule a line")
    ap.add_argument("--vocab-from", help="take the vocabulary of this molgen model "
                    "(default: specials + the data's tokens, sorted, as molgen train makes it)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ctx-len", type=int, default=160)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.02)
    ap.add_argument("--warmup", type=int, default=500, help="warm-up steps")
    ap.add_argument("--time-limit", type=float, required=True, help="seconds of training")
    ap.add_argument("--val-every", type=float, default=15.0, help="seconds between validations")
    ap.add_argument("--val-frac", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1, help="split seed (molgen train's --seed)")
    ap.add_argument("--torch-seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-amp", action="store_true", help="fp32 training (default bf16 autocast on CUDA)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (smoke tests)")
    a = ap.parse_args(argv)

    t_start = time.time()
    smiles = read_lines(a.data)
    if a.vocab_from:
        _, meta = load_safetensors(a.vocab_from)
        vocab = json.loads(meta["vocab"])
    else:
        vocab = SPECIALS + sorted({t for s in smiles for t in tokenize(s)})
    tr_i, va_i = split_indices(len(smiles), a.val_frac, a.seed)
    T = max(len(tokenize(s)) for s in smiles) + 2
    if T - 1 > a.ctx_len:
        raise SystemExit("a molecule of %d tokens does not fit --ctx-len %d" % (T - 2, a.ctx_len))
    ids, lengths = encode_all(smiles, vocab, T)
    dev = torch.device(a.device)
    tr_ids, tr_len = torch.from_numpy(ids[tr_i]).to(dev), torch.from_numpy(lengths[tr_i]).to(dev)
    va_ids, va_len = torch.from_numpy(ids[va_i]).to(dev), torch.from_numpy(lengths[va_i]).to(dev)

    torch.manual_seed(a.torch_seed)
    cfg = Config(a.layers, a.d_model, a.heads, a.ctx_len, len(vocab), a.dropout)
    model = MolGPT(cfg).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    kw = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
    amp = dev.type == "cuda" and not a.no_amp
    N = tr_ids.shape[0]
    print("model: %d layers, d_model %d, %d heads, ctx %d, vocab %d, dropout %g: %d parameters; "
          "%d train / %d validation molecules; batch %d; %s%s"
          % (a.layers, a.d_model, a.heads, a.ctx_len, len(vocab), a.dropout, nparam, N,
             va_ids.shape[0], a.batch, dev, " bf16 autocast" if amp else " fp32"), file=sys.stderr, flush=True)
    v0 = val_loss(model, va_ids, va_len)
    print("step 0: val loss %.4f" % v0, file=sys.stderr, flush=True)

    best, step, seen = float("inf"), 0, 0
    perm, at = torch.randperm(N, device=dev), 0
    run_loss = torch.zeros((), device=dev)
    run_n = 0
    t0 = time.time()
    next_val = a.val_every
    hist = []
    while True:
        el = time.time() - t0
        done = el >= a.time_limit or (a.max_steps and step >= a.max_steps)
        if el >= next_val or done:
            v = val_loss(model, va_ids, va_len)
            v2k = val_loss(model, va_ids[:2000], va_len[:2000])
            tl = float(run_loss) / max(run_n, 1)
            run_loss.zero_()
            run_n = 0
            lr = opt.param_groups[0]["lr"]
            print("step %d: train loss %.4f, val loss %.4f (first 2000: %.4f), lr %.2e, %.0f s, "
                  "%.1f epochs" % (step, tl, v, v2k, lr, el, seen / N), file=sys.stderr, flush=True)
            hist.append([step, round(el, 1), round(v, 5)])
            if v < best:
                best = v
                save_model(model, vocab, a.out,
                           {"step": step, "seconds": round(el, 1), "epochs": round(seen / N, 2),
                            "val_loss": round(v, 5), "val_loss_first2000": round(v2k, 5),
                            "batch": a.batch, "lr": a.lr, "min_lr_frac": a.min_lr_frac,
                            "warmup": a.warmup, "time_limit": a.time_limit, "split_seed": a.seed,
                            "val_frac": a.val_frac, "torch": torch.__version__,
                            "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                            "amp": "bf16" if amp else "fp32", "data": os.path.basename(a.data)})
            next_val = el + a.val_every
            if done:
                break
        frac = min(el / a.time_limit, 1.0)
        lr = a.lr * (step + 1) / a.warmup if step < a.warmup else \
            a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        if at + a.batch > N:
            perm, at = torch.randperm(N, device=dev), 0
        idx = perm[at:at + a.batch]
        at += a.batch
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
            loss, _ = batch_loss(model, tr_ids[idx], tr_len[idx], a.dropout, True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        run_loss += loss.detach()
        run_n += 1
        step += 1
        seen += a.batch
    print("best val loss %.4f; %d steps in %.0f s (%.0f s with set-up); model in %s"
          % (best, step, time.time() - t0, time.time() - t_start, a.out), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
