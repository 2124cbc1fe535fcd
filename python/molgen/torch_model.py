"""molgen's transformer in PyTorch: the same model as molgen/nn/model.c.

Same configuration (n_layer, d_model, n_head, ctx_len, vocab_size, dropout),
same parameter names and shapes (so a molgen checkpoint loads with
load_state_dict), same init scheme, same loss:

    x      = drop(tok_emb[ids] + pos_emb[0..L))
    block  : x = x + drop(MHA(LN1(x)))    causal + key padding, attention dropout
             x = x + drop(proj(gelu_tanh(fc(LN2(x)))))
    logits = head(LN_f(x))                  (untied head with bias)
    loss   = mean cross-entropy over the target positions t < length - 1

Rows are molgen's data layout: BOS t1 .. tk EOS PAD..., lengths = k + 2;
input = ids[:, :-1], target = ids[:, 1:], key_lengths = lengths - 1.

Uses: the gradient oracle of molgen/tests/nn/test_model_torch.py, and
`bench` mode, the PyTorch side of the training tokens/s comparison
(`molgen bench` measures the C side the same way: random full rows of
B x ctx positions, every position a real target, forward + backward +
AdamW step; median of runs):

    /usr/bin/python3 -m molgen.torch_model bench [--molgpt] [--batch 64]
        [--ctx 54] [--runs 5] [--warmup 1] [--steps 3] [--threads N] [--attn] [--json]
        (--attn: attn.torch.MultiheadAttention in every block, same init; the
        JSON's "losses" are every step's loss, to compare the two)
    /usr/bin/python3 -m molgen.torch_model loss --model out/model.safetensors
        --data FILE [--n 1000]     (mean loss of a checkpoint on molecules)

Needs torch (1.13 tested) and numpy; safetensors files are read and written
with the tiny parser below (no safetensors package).
"""
import argparse
import json
import math
import os
import re
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from molgen.atomic import atomic_open

PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<bos>", "<eos>"]

# ---------------------------------------------------------------- safetensors

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}


def load_safetensors(path):
    """Read a safetensors file: ({name: numpy array}, {metadata key: str}),
    the tensors in the order of their data in the file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError("%s: header size %d beyond the file" % (path, n))
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    buf = memoryview(raw)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dt = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
        b, e = info["data_offsets"]
        arr = np.frombuffer(buf[b:e], dtype=dt).reshape(info["shape"])
        tensors[name] = arr.copy()
    return tensors, meta


def save_safetensors(path, tensors, meta=None):
    """Write {name: numpy array} (+ string metadata) as safetensors."""
    rev = {np.dtype(v): k for k, v in _DTYPES.items()}
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": rev[arr.dtype.newbyteorder("=")], "shape": list(arr.shape),
                        "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with atomic_open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- model

class Config:
    def __init__(self, n_layer=4, d_model=128, n_head=4, ctx_len=54, vocab_size=26,
                 dropout=0.0, causal=True):
        self.n_layer, self.d_model, self.n_head = n_layer, d_model, n_head
        self.ctx_len, self.vocab_size, self.dropout = ctx_len, vocab_size, dropout
        self.causal = causal

    @classmethod
    def from_json(cls, text):
        j = json.loads(text)
        return cls(j["n_layer"], j["d_model"], j["n_head"], j["ctx_len"], j["vocab_size"],
                   j.get("dropout", 0.0), j.get("causal", True))

    @classmethod
    def molgpt(cls, ctx_len=54, vocab_size=26):
        return cls(8, 256, 8, ctx_len, vocab_size, 0.1)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg, attention=nn.MultiheadAttention):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)  # eps 1e-5, as model.c
        # attention: torch.nn.MultiheadAttention or a drop-in with its
        # interface (attn.torch.MultiheadAttention, bench --attn)
        self.attn = attention(d, cfg.n_head, dropout=cfg.dropout, bias=True, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, attn_mask, key_padding_mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                         need_weights=False)
        x = x + self.drop(a)
        return x + self.drop(self.mlp(self.ln2(x)))


class MolGPT(nn.Module):
    def __init__(self, cfg, attention=nn.MultiheadAttention):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.ctx_len, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([Block(cfg, attention) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)
        self.init_weights()

    def init_weights(self, seed=None):
        """model.c's scheme: N(0, 0.02) for embeddings and linear weights
        (attention in/out projections included), out_proj and mlp.proj
        N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1. The
        values differ from C's (another RNG); the distribution is the same."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        resid = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln" in "." + name or name.startswith("ln_f"):
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif p.dim() == 1:
                    p.zero_()
                elif name.endswith("out_proj.weight") or name.endswith("mlp.proj.weight"):
                    p.normal_(0.0, resid, generator=g)
                else:
                    p.normal_(0.0, 0.02, generator=g)

    def logits(self, inp, key_lengths=None):
        """inp [B, L] ids -> logits [B, L, V]; key_lengths [B] valid positions."""
        B, L = inp.shape
        pos = torch.arange(L, device=inp.device)
        x = self.drop(self.tok_emb(inp) + self.pos_emb(pos)[None])
        attn_mask = None
        if self.cfg.causal:  # True = not allowed
            attn_mask = torch.triu(torch.ones(L, L, dtype=torch.bool, device=inp.device), 1)
        kpm = None
        if key_lengths is not None:
            kpm = pos[None, :] >= key_lengths[:, None]
        for blk in self.blocks:
            x = blk(x, attn_mask, kpm)
        return self.head(self.ln_f(x))

    def loss(self, ids, lengths):
        """ids [B, T] rows, lengths [B] -> (mean loss over non-pad targets, count)."""
        inp, tgt = ids[:, :-1], ids[:, 1:]
        kl = lengths - 1
        logits = self.logits(inp, kl)
        mask = torch.arange(inp.shape[1], device=ids.device)[None, :] < kl[:, None]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                             reduction="none").reshape(tgt.shape)
        n = mask.sum()
        return (ce * mask).sum() / n, int(n)


def load_model(path, dtype=torch.float32, raw=False):
    """A molgen model file or checkpoint -> (MolGPT, vocab list or None).

    Like molgen: a checkpoint of `train --ema` gives its averaged weights
    (the flat "ema" tensor, in the layout of the parameter tensors as
    their data lie in the file) unless raw."""
    tensors, meta = load_safetensors(path)
    cfg = Config.from_json(meta["config"])
    model = MolGPT(cfg).to(dtype)
    names = dict(model.named_parameters())
    if "ema" in tensors and not raw:
        flat, at = tensors["ema"], 0
        for k, v in list(tensors.items()):  # the parameters in file order: the flat layout
            if k not in ("ema", "optim.m", "optim.v"):
                tensors[k] = flat[at:at + v.size].reshape(v.shape)
                at += v.size
        if at != flat.size:
            raise ValueError("%s: 'ema' holds %d values, the parameters %d" % (path, flat.size, at))
    state = {k: torch.from_numpy(v).to(dtype) for k, v in tensors.items() if k in names}
    missing = set(dict(model.named_parameters())) - set(state)
    if missing:
        raise ValueError("%s lacks %s" % (path, sorted(missing)[:5]))
    model.load_state_dict(state, strict=True)
    vocab = json.loads(meta["vocab"]) if "vocab" in meta else None
    return model, vocab


# ---------------------------------------------------------------- data

_TOKEN_RE = re.compile(r"(\[[^\]]+]|<|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>|\*|\$|\%[0-9]{2}|[0-9])")


def tokenize(smi):
    toks = _TOKEN_RE.findall(smi)
    if "".join(toks) != smi:
        raise ValueError("cannot tokenise %r" % smi)
    return toks


def read_smiles(path, n=None):
    out = []
    with open(path) as f:
        for line in f:
            s = line.split()
            if not s or s[0].startswith("#"):
                continue
            out.append(s[0])
            if n and len(out) >= n:
                break
    return out


def encode(smiles, vocab, T):
    idx = {t: i for i, t in enumerate(vocab)}
    ids = np.zeros((len(smiles), T), dtype=np.int64)
    lengths = np.zeros(len(smiles), dtype=np.int64)
    for r, s in enumerate(smiles):
        row = [BOS] + [idx[t] for t in tokenize(s)] + [EOS]
        if len(row) > T:
            raise ValueError("molecule %d longer than the context" % r)
        ids[r, :len(row)] = row
        lengths[r] = len(row)
    return ids, lengths


def molecule_nll(model, vocab, smiles):
    """Per molecule, the summed cross-entropy of its targets (the tokens
    after BOS, EOS included) and their count: what `molgen score` reports
    as nll and tokens. The model in eval mode, no gradient."""
    ids, lengths = encode(smiles, vocab, model.cfg.ctx_len + 1)
    ids, lengths = torch.from_numpy(ids), torch.from_numpy(lengths)
    model.eval()
    with torch.no_grad():
        logits = model.logits(ids[:, :-1], lengths - 1)
        ce = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    n = lengths - 1
    return [float(ce[i, :int(n[i])].sum()) for i in range(len(smiles))], [int(k) for k in n]


# ---------------------------------------------------------------- modes

def _attn_torch():
    """attn.torch (the attn package, installed beside this one)."""
    import attn.torch
    return attn.torch


def bench_config(args):
    if args.molgpt:
        return Config.molgpt(args.ctx, args.vocab)
    return Config(args.layers, args.d_model, args.heads, args.ctx, args.vocab, args.dropout)


def bench_model(cfg, attn=False):
    """(model in training mode, its AdamW) with the bench's init (seed 0);
    attn=True: attn.torch.MultiheadAttention in every block, with the plain
    twin's exact init (attn's module draws the same values; this makes sure)."""
    torch.manual_seed(0)
    model = MolGPT(cfg, _attn_torch().MultiheadAttention if attn else nn.MultiheadAttention)
    if attn:
        torch.manual_seed(0)
        model.load_state_dict(MolGPT(cfg).state_dict())
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    return model, opt


def bench_batches(cfg, B, nbatch, data=None):
    """[(ids, lengths)]: one batch of random full rows, or nbatch real batches
    from data as molgen bench --data makes them (molecules in file order, B
    per batch, each batch cut to its longest row)."""
    T = cfg.ctx_len + 1
    if not data:
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, cfg.vocab_size, (B, T), generator=g)
        lengths = torch.full((B,), T, dtype=torch.int64)  # every position a real target
        return [(ids, lengths)]
    smiles = [s for s in read_smiles(data) if len(tokenize(s)) + 2 <= T]
    vocab = SPECIALS + sorted({t for s in smiles for t in tokenize(s)})
    if len(vocab) > cfg.vocab_size:
        raise SystemExit("molgen.torch_model: %s has %d token kinds, more than the config's %d"
                         % (data, len(vocab), cfg.vocab_size))
    need = nbatch * B
    smiles = (smiles * (need // len(smiles) + 1))[:need]
    ids_all, len_all = encode(smiles, vocab, T)
    batches = []
    for j in range(nbatch):
        lj = len_all[j * B:(j + 1) * B]
        batches.append((torch.from_numpy(ids_all[j * B:(j + 1) * B, :lj.max()]),
                        torch.from_numpy(lj)))
    return batches


def train_step(model, opt, ids, lengths):
    """One bench training step: -> (loss, real targets counted)."""
    loss, n = model.loss(ids, lengths)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss), n


def bench(args):
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = bench_config(args)
    model, opt = bench_model(cfg, args.attn)
    B = args.batch
    batches = bench_batches(cfg, B, (args.warmup + args.runs) * args.steps, args.data)
    counter = [0]
    losses = []

    def run():
        tok = 0
        t0 = time.perf_counter()
        for _ in range(args.steps):
            ids, lengths = batches[counter[0] % len(batches)]
            counter[0] += 1
            loss, n = train_step(model, opt, ids, lengths)
            losses.append(loss)
            tok += n
        return tok / (time.perf_counter() - t0)

    for _ in range(args.warmup):
        run()
    rates = sorted(run() for _ in range(args.runs))
    med = rates[len(rates) // 2] if len(rates) % 2 else 0.5 * (rates[len(rates) // 2 - 1] + rates[len(rates) // 2])
    nparams = sum(p.numel() for p in model.parameters())
    res = {"impl": "torch+attn" if args.attn else "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
           "n_layer": cfg.n_layer, "d_model": cfg.d_model, "n_head": cfg.n_head,
           "ctx_len": cfg.ctx_len, "vocab_size": cfg.vocab_size, "dropout": cfg.dropout,
           "params": nparams, "batch": B, "steps": args.steps, "runs": args.runs,
           "train_tokens_per_sec": med, "train_tokens_per_sec_min": rates[0],
           "train_tokens_per_sec_max": rates[-1], "losses": losses}
    if args.json:
        print(json.dumps(res))
    else:
        print("torch %s%s, %d threads: %d layers, d_model %d, %d heads, ctx %d, vocab %d, %d params"
              % (torch.__version__, " with attn.torch.MultiheadAttention" if args.attn else "",
                 res["threads"], cfg.n_layer, cfg.d_model, cfg.n_head, cfg.ctx_len,
                 cfg.vocab_size, nparams))
        print("training: %.0f tokens/s median (%.0f .. %.0f), batch %d x %s, %d steps x %d runs"
              % (med, rates[0], rates[-1], B, "its longest row (%s)" % args.data if args.data
                 else cfg.ctx_len, args.steps, args.runs))
        print("loss: step 1 %.6f, step %d %.6f" % (losses[0], len(losses), losses[-1]))
    return 0


def loss_mode(args):
    model, vocab = load_model(args.model, torch.float64 if args.double else torch.float32)
    if vocab is None:
        print("molgen.torch_model: %s has no vocab" % args.model, file=sys.stderr)
        return 1
    smiles = read_smiles(args.data, args.n)
    ids, lengths = encode(smiles, vocab, model.cfg.ctx_len + 1)
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(smiles), 256):
            l, n = model.loss(torch.from_numpy(ids[i:i + 256]), torch.from_numpy(lengths[i:i + 256]))
            total += float(l) * n
            count += n
    print(json.dumps({"model": args.model, "molecules": len(smiles), "tokens": count,
                      "loss": total / count}))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog='python3 -m molgen.torch_model',
                                     description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("bench", help="training tokens/s of the PyTorch model")
    b.add_argument("--molgpt", action="store_true", help="8 layers, d 256, 8 heads, dropout 0.1")
    b.add_argument("--layers", type=int, default=4)
    b.add_argument("--d-model", type=int, default=128)
    b.add_argument("--heads", type=int, default=4)
    b.add_argument("--dropout", type=float, default=0.0)
    b.add_argument("--ctx", type=int, default=54, help="input positions (default 54)")
    b.add_argument("--vocab", type=int, default=27)
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--runs", type=int, default=5)
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--steps", type=int, default=3)
    b.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    b.add_argument("--data", help="train on this .smi's molecules (file order) instead of "
                   "random full rows")
    b.add_argument("--attn", action="store_true",
                   help="attn.torch.MultiheadAttention (libattn) in place of torch's attention")
    b.add_argument("--json", action="store_true")
    l = sub.add_parser("loss", help="mean loss of a checkpoint on a SMILES file")
    l.add_argument("--model", required=True)
    l.add_argument("--data", required=True)
    l.add_argument("--n", type=int, default=1000)
    l.add_argument("--double", action="store_true")
    args = ap.parse_args(argv)
    try:
        return bench(args) if args.mode == "bench" else loss_mode(args)
    except (OSError, ValueError, KeyError) as e:
        print("molgen.torch_model: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
