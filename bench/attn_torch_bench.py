#!/usr/bin/python3
"""attn.torch against PyTorch 1.13, measured side by side. From the source
tree, with the packages of python/ on the path (or installed):

    PYTHONPATH=python /usr/bin/python3 bench/attn_torch_bench.py sdpa [--threads 1 2] [--rounds 3]
        [--reps 7] [--case B,H,L,D,causal ...]
      scaled dot-product attention, forward and forward + backward (autograd,
      grad_out of ones): attn.torch.scaled_dot_product_attention vs torch's
      math path (softmax(q kᵀ * scale, masked_fill(-inf) when causal) v).
    PYTHONPATH=python /usr/bin/python3 bench/attn_torch_bench.py train [--threads 1 2] [--rounds 3]
        [--steps 10] [--batch 32] [--data FILE]
      molgen's PyTorch twin (molgen.torch_model bench's model, init,
      batches and step), training tokens/s with torch's attention and with
      attn.torch.MultiheadAttention (bench --attn), both in this process,
      one step of each in turn on the same batch sequence; and the largest
      difference of their losses (all steps, and the first 30: repeating
      one batch of full rows, rounding differences grow after about 34
      steps, as much between PyTorch's own 1- and 2-thread runs).

Both modes interleave A and B call by call (sdpa: one call of each in
turn; train: one step of each in turn) and report per-round medians: the host is shared, so only
side-by-side ratios mean anything. Run with OMP_WAIT_POLICY=PASSIVE (set here if unset), the setting
under which PyTorch's two threads are not slower than one on this machine.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

DEFAULT_CASES = ["32,8,64,32,0", "4,8,512,64,1", "1,8,1024,64,0"]


def sdpa_mode(args):
    import torch
    import attn.torch as at

    def math_path(q, k, v, causal):
        s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
        if causal:
            L = q.shape[-2]
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v

    impls = {"attn": lambda q, k, v, c: at.scaled_dot_product_attention(q, k, v, is_causal=c),
             "torch-math": math_path}
    rows = []
    for case in args.case:
        B, H, L, D, causal = (int(x) for x in case.split(","))
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, L, D, generator=g).requires_grad_(True) for _ in range(3))
        go = torch.ones(B, H, L, D)
        for threads in args.threads:
            torch.set_num_threads(threads)

            def once(name, backward):
                f = impls[name]
                t0 = time.perf_counter()
                out = f(q, k, v, bool(causal))
                if backward:
                    out.backward(go)
                dt = time.perf_counter() - t0
                for x in (q, k, v):
                    x.grad = None
                return dt

            for name in impls:  # warm-up
                once(name, True)
            for op, bwd in (("fwd", False), ("fwd+bwd", True)):
                per = {n: [] for n in impls}
                for r in range(args.rounds):
                    t = {n: [] for n in impls}
                    with torch.set_grad_enabled(bwd):
                        for i in range(args.reps):  # one call of each in turn
                            for name in (list(impls) if (r + i) % 2 == 0 else list(impls)[::-1]):
                                t[name].append(once(name, bwd))
                    for n in impls:
                        per[n].append(1e3 * statistics.median(t[n]))
                row = {"case": case, "threads": threads, "op": op,
                       "attn_ms": per["attn"], "torch_math_ms": per["torch-math"],
                       "ratio": [t / a for a, t in zip(per["attn"], per["torch-math"])]}
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                else:
                    print("%-16s %d thr %-7s attn %s ms | torch math %s ms | %s x" % (
                        case, threads, op, " / ".join("%.2f" % x for x in row["attn_ms"]),
                        " / ".join("%.2f" % x for x in row["torch_math_ms"]),
                        " / ".join("%.2f" % x for x in row["ratio"])), flush=True)
    return 0


def train_mode(args):
    import torch
    from molgen import torch_model as tm
    cfg = tm.Config()  # molgen.torch_model bench's default config
    cfg.vocab_size = 27
    steps = args.rounds * args.steps + 2
    for threads in args.threads:
        torch.set_num_threads(threads)
        models = {"torch": tm.bench_model(cfg), "attn": tm.bench_model(cfg, attn=True)}
        batches = tm.bench_batches(cfg, args.batch, steps, args.data)
        losses = {n: [] for n in models}
        rates = {n: [] for n in models}

        def step(name):
            i = len(losses[name])  # both models see the same batch sequence
            t0 = time.perf_counter()
            loss, n = tm.train_step(*models[name], *batches[i % len(batches)])
            dt = time.perf_counter() - t0
            losses[name].append(loss)
            return n / dt

        for name in models:  # warm-up: 2 steps each
            step(name)
            step(name)
        for r in range(args.rounds):
            per = {n: [] for n in models}
            for i in range(args.steps):
                for name in (["torch", "attn"] if (r + i) % 2 == 0 else ["attn", "torch"]):
                    per[name].append(step(name))
            for n in models:
                rates[n].append(statistics.median(per[n]))
        diff = [abs(a - b) for a, b in zip(losses["torch"], losses["attn"])]
        dl, dl30 = max(diff), max(diff[:30])
        row = {"threads": threads, "batch": args.batch, "data": args.data,
               "torch_tokens_per_sec": rates["torch"], "attn_tokens_per_sec": rates["attn"],
               "ratio": [a / t for a, t in zip(rates["attn"], rates["torch"])],
               "steps": len(losses["torch"]), "first_loss": losses["torch"][0],
               "last_loss": [losses["torch"][-1], losses["attn"][-1]],
               "max_abs_loss_diff": dl, "max_abs_loss_diff_first30": dl30}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print("%d thr: torch %s | torch+attn %s tokens/s | %s x | %d steps each, loss "
                  "%.6f -> %.6f / %.6f, max |diff| %.2e (steps 1-30: %.2e)" % (
                      threads, " / ".join("%.0f" % x for x in rates["torch"]),
                      " / ".join("%.0f" % x for x in rates["attn"]),
                      " / ".join("%.2f" % x for x in row["ratio"]), row["steps"],
                      row["first_loss"], row["last_loss"][0], row["last_loss"][1], dl, dl30),
                  flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["sdpa", "train"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7, help="sdpa: timed calls per round")
    ap.add_argument("--steps", type=int, default=10, help="train: steps per model per round")
    ap.add_argument("--batch", type=int, default=32, help="train: molecules per batch")
    ap.add_argument("--data", help="train: real batches from this .smi (else random full rows)")
    ap.add_argument("--case", nargs="+", default=DEFAULT_CASES, help="sdpa: B,H,L,D,causal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    return sdpa_mode(args) if args.mode == "sdpa" else train_mode(args)


if __name__ == "__main__":
    sys.exit(main())
