#!/usr/bin/python3
"""PyTorch math-path attention timings on attn-bench's suite, for comparison.

    /usr/bin/python3 bench/torch_attn_bench.py [--threads N] [--json]
        [--case B,H,Lq,Lk,D,causal]... [--reps N] [--peak GFLOPS] [--max-gb G]
        [--clock wall|cpu]

The math path is what torch.nn.functional.scaled_dot_product_attention falls
back to on CPU in torch 1.13: matmul, masked_fill (causal), softmax, matmul.
"fwd" times the forward under no_grad; "bwd" times the backward alone
(autograd through the same graph, retain_graph, grads cleared between runs).
Each is the median of --reps (default 5) runs after a warm-up. GFLOP/s use
attn-bench's dense counts (4*B*H*Lq*Lk*D forward, 10*B*H*Lq*Lk*D backward,
also when causal). peak_frac needs --peak (attn-bench prints its measured FMA
peak); otherwise it is null. rss_mb is the process's peak RSS so far.
--clock cpu times with the process's CPU time divided by the thread count,
as attn-bench --clock cpu does (for shared machines).
Cases whose B*H*Lq*Lk score tensors would need more than --max-gb (default
4) GB for the forward+backward are skipped, and the output says so (the
L=16384 case needs 8.6 GB for one copy of its scores)."""
import argparse
import json
import math
import resource
import sys
import time

import torch

SUITE = [(32, 8, 64, 64, 32, False), (32, 8, 128, 128, 32, True), (4, 8, 512, 512, 64, True),
         (1, 8, 1024, 1024, 64, False), (1, 8, 2048, 2048, 64, True), (1, 8, 4096, 4096, 64, False),
         (1, 8, 16384, 16384, 64, True), (16, 8, 1, 2048, 64, False)]


def parse_case(s):
    p = s.split(",")
    if len(p) != 6:
        raise argparse.ArgumentTypeError("expected B,H,Lq,Lk,D,causal")
    c = p[5].strip().lower()
    if c not in ("0", "1", "no", "yes", "true", "false"):
        raise argparse.ArgumentTypeError("causal must be 0/1 or yes/no")
    return tuple(int(x) for x in p[:5]) + (c in ("1", "yes", "true"),)


def attention(q, k, v, causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        lq, lk = q.size(-2), k.size(-2)  # bottom-right aligned, as attn does
        mask = torch.ones(lq, lk, dtype=torch.bool).triu(lk - lq + 1)
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, -1) @ v


CLOCK = [time.perf_counter]


def median_ms(f, reps):
    f()
    ts = []
    for _ in range(reps):
        t = CLOCK[0]()
        f()
        ts.append(CLOCK[0]() - t)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--case", type=parse_case, action="append")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--peak", type=float, default=None, help="fp32 FMA peak in GFLOP/s (from attn-bench)")
    ap.add_argument("--max-gb", type=float, default=4.0)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.clock == "cpu":
        CLOCK[0] = lambda: time.process_time() / a.threads
    cases = a.case or SUITE
    if not a.json:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, math path")
        print(f"{'impl':<10} {'op':<3} {'B':>5} {'H':>3} {'Lq':>6} {'Lk':>6} {'D':>4} {'causal':<6} "
              f"{'ms':>10} {'GFLOP/s':>9} {'peak':>7} {'rss_MB':>9}")
    torch.manual_seed(0)
    for (B, H, Lq, Lk, D, causal) in cases:
        # scores, softmax output, their gradients and the mask: ~4 copies
        need_gb = 4.0 * B * H * Lq * Lk * 4 / 2**30
        if need_gb > a.max_gb:
            msg = (f"skipped: {B*H*Lq*Lk*4/2**30:.1f} GB per score tensor, ~{need_gb:.0f} GB for "
                   f"forward+backward > --max-gb {a.max_gb:g}")
            if a.json:
                print(json.dumps({"impl": "torch-math", "B": B, "H": H, "Lq": Lq, "Lk": Lk, "D": D,
                                  "causal": causal, "skipped": msg}), flush=True)
            else:
                print(f"torch-math {B},{H},{Lq},{Lk},{D},{'yes' if causal else 'no'} {msg}", flush=True)
            continue
        q, k, v = torch.randn(B, H, Lq, D), torch.randn(B, H, Lk, D), torch.randn(B, H, Lk, D)
        cells = float(B) * H * Lq * Lk * D
        with torch.no_grad():
            fwd_ms = median_ms(lambda: attention(q, k, v, causal), a.reps)
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
        out = attention(qg, kg, vg, causal)
        go = torch.randn_like(out)

        def bwd():
            qg.grad = kg.grad = vg.grad = None
            torch.autograd.backward(out, go, retain_graph=True)

        bwd_ms = median_ms(bwd, a.reps)
        for op, ms, mult in (("fwd", fwd_ms, 4.0), ("bwd", bwd_ms, 10.0)):
            gf = mult * cells / (ms * 1e-3) / 1e9
            r = {"impl": "torch-math", "op": op, "B": B, "H": H, "Lq": Lq, "Lk": Lk, "D": D,
                 "causal": causal, "ms": round(ms, 3), "gflops": round(gf, 2),
                 "peak_frac": round(gf / a.peak, 4) if a.peak else None, "rss_mb": round(rss_mb(), 1)}
            if a.json:
                print(json.dumps(r), flush=True)
            else:
                pk = f"{100 * gf / a.peak:6.1f}%" if a.peak else "     -"
                print(f"{'torch-math':<10} {op:<3} {B:>5} {H:>3} {Lq:>6} {Lk:>6} {D:>4} "
                      f"{'yes' if causal else 'no':<6} {ms:>10.3f} {gf:>9.1f} {pk:>7} {r['rss_mb']:>9.1f}",
                      flush=True)
        del out, qg, kg, vg
    return 0


if __name__ == "__main__":
    sys.exit(main())
