#!/usr/bin/python3
"""attn.torch against PyTorch 1.13, measured side by side.

    /usr/bin/python3 bench/attn_torch_bench.py sdpa [--threads 1 2] [--rounds 3]
        [--reps 7] [--case B,H,L,D,causal ...]
      scaled dot-product attention, forward and forward + backward (autograd,
      grad_out of ones): attn.torch.scaled_dot_product_attention vs torch's
      math path (softmax(q kᵀ * scale, masked_fill(-inf) when causal) v).
    /usr/bin/python3 bench/attn_torch_bench.py train [--threads 1 2] [--rounds 3]
        [-- ARGS for molgen/torch_model.py bench]
      molgen's PyTorch twin, training tokens/s with torch's attention and with
      attn.torch.MultiheadAttention (torch_model.py bench vs bench --attn,
      each a fresh process), and the largest difference of their losses.

Both modes interleave A and B within each round (A B, then B A) and report
per-round medians: the host is shared, so only side-by-side ratios mean
anything. Run with OMP_WAIT_POLICY=PASSIVE (set here if unset), the setting
under which PyTorch's two threads are not slower than one on this machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

DEFAULT_CASES = ["32,8,64,32,0", "4,8,512,64,1", "1,8,1024,64,0"]


def sdpa_mode(args):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "python"))
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
                    order = list(impls) if r % 2 == 0 else list(impls)[::-1]
                    for name in order:
                        with torch.set_grad_enabled(bwd):
                            per[name].append(1e3 * statistics.median(
                                once(name, bwd) for _ in range(args.reps)))
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
    script = os.path.join(ROOT, "molgen", "torch_model.py")
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    for threads in args.threads:
        rates = {"torch": [], "attn": []}
        losses = {}
        for r in range(args.rounds):
            order = ["torch", "attn"] if r % 2 == 0 else ["attn", "torch"]
            for name in order:
                cmd = [sys.executable, script, "bench", "--json", "--threads", str(threads)]
                cmd += (["--attn"] if name == "attn" else []) + args.rest
                res = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True,
                                                text=True).stdout.strip().splitlines()[-1])
                rates[name].append(res["train_tokens_per_sec"])
                losses.setdefault(name, res["losses"])
                if res["losses"] != losses[name]:
                    raise SystemExit("%s: losses differ between runs of the same bench" % name)
        dl = max(abs(a - b) for a, b in zip(losses["torch"], losses["attn"]))
        row = {"threads": threads, "torch_tokens_per_sec": rates["torch"],
               "attn_tokens_per_sec": rates["attn"],
               "ratio": [a / t for a, t in zip(rates["attn"], rates["torch"])],
               "steps": len(losses["torch"]), "first_loss": losses["torch"][0],
               "last_loss": [losses["torch"][-1], losses["attn"][-1]],
               "max_abs_loss_diff": dl}
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            print("%d thr: torch %s | torch+attn %s tokens/s | %s x | %d steps, loss %.6f -> "
                  "%.6f / %.6f, max |diff| %.2e" % (
                      threads, " / ".join("%.0f" % x for x in rates["torch"]),
                      " / ".join("%.0f" % x for x in rates["attn"]),
                      " / ".join("%.2f" % x for x in row["ratio"]), row["steps"],
                      row["first_loss"], row["last_loss"][0], row["last_loss"][1], dl),
                  flush=True)
    return 0


def main():
    argv = sys.argv[1:]
    rest = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["sdpa", "train"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=7, help="sdpa: timed calls per round")
    ap.add_argument("--case", nargs="+", default=DEFAULT_CASES, help="sdpa: B,H,L,D,causal")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    args.rest = rest
    return sdpa_mode(args) if args.mode == "sdpa" else train_mode(args)


if __name__ == "__main__":
    sys.exit(main())
