#!/usr/bin/python3
"""Every speed figure the README states, measured side by side in one run.

    /usr/bin/python3 bench/speed_report.py [--threads 2] [--rounds 2]
        [--out DIR] [--ort-modules DIR] [--build build]
        [--only attention|train|sample|variants|isa]...

Each round runs, one after the other on the same threads:
  attention  attn-bench --impl fused (the suite; the fused path), in fp32 and
             with --dtype bf16 (bf16 q, k, v; fp32 accumulation),
             bench/torch_attn_bench.py (PyTorch's math path) and
             ../shared/peers/ort_attn_bench.js attn23 mha gqa (onnxruntime's
             three CPU operators, when node and onnxruntime-node are there:
             --ort-modules, default /tmp/ort/node_modules);
  training   molgen bench --no-sample --batch 32 (default config and MolGPT's,
             random full rows and the batches of data/moses_20k.smi; fp32 and
             --dtype bf16) beside
             python3 -m molgen.torch_model bench (the PyTorch twin, 1 thread and the
             threads with OMP_WAIT_POLICY=PASSIVE, its best of the two);
  sampling   molgen bench --no-train on the shipped model (KV cache and
             naive, batch 64; KV also with --dtype bf16) beside python3 -m molgen.torch_sample (--kv, and the
             prefix re-run: MolGPT's sampler);
  variants   attn-bench on issue 36's targets: GQA decoding (B 1, H 32, D 128,
             Lk 8192) with 8 vs 32 K/V heads in fp32 and bf16, split-KV
             decoding (B 1, H 8, D 128, Lk 32768) on 2 threads vs 1, the
             L >= 1024 suite shapes plain and with --softcap 30 / --alibi /
             --sinks, and the suite's causal shapes with --kv-heads 2 (H/4)
             beside H_kv = H and bench/ort_gqa_bench.js (onnxruntime's
             GroupQueryAttention with kv_num_heads = H/4);
  isa        issue 37's products and forced rows: bench/sgemm_candidates.sh
             (fp32 1024^3 on the threads: attn_sgemm on each ISA row the CPU
             runs, OpenBLAS, BLIS and oneDNN when installed), and, on a CPU
             with AVX-512, attn-bench's fp32 suite and molgen bench's fp32
             training on real batches with ATTN_FUSED_ISA=avx2 (libattn's
             kernels as an AVX2-only CPU runs them), each back to back with
             the same run on this CPU's own row; on a CPU with AMX, the bf16
             suite and molgen's bf16 training on real batches on AMX tiles
             (attn-bench and molgen take them) back to back with
             ATTN_FUSED_ISA=avx512bf16 MOLGEN_GEMM_ISA=avx512bf16.
Rounds interleave the programs, so a change in the machine's load shows up
in every column; the tables give the median over rounds of each program's
own median, and the figures of each round in the raw file.
Writes DIR/raw.jsonl (every measurement, with its round, and a first line
with the date and the machine) and prints the markdown tables with each
target of issue 14 beside its figure. --markdown PATH also writes them into
PATH (docs/speed.md): between its lines `<!-- speed_report:begin -->` and
`<!-- speed_report:end -->` when it has them (the rest of the page is kept),
else as a new page. --report RAW renders an earlier raw file, running
nothing (with --markdown: regenerates the page from it).
OPENBLAS_CORETYPE is kept as set (the project sets Haswell)."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHARED = os.environ.get("MOLGEN_SHARED", os.path.join(os.path.dirname(REPO), "shared"))
MODEL = os.path.join(REPO, "models", "molgen-moses.safetensors")
DATA = os.path.join(REPO, "data", "moses_20k.smi")
PY = "/usr/bin/python3"


def run(cmd, env=None, timeout=1800):
    e = dict(os.environ)
    e.setdefault("OPENBLAS_CORETYPE", "Haswell")
    # `python3 -m molgen.*` runs this tree's package (python/molgen)
    e["PYTHONPATH"] = os.pathsep.join([os.path.join(REPO, "python")] +
                                      [p for p in [os.environ.get("PYTHONPATH")] if p])
    e.update(env or {})
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return p.stdout, time.time() - t0


def json_lines(text):
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


def case_key(r):
    return (r["B"], r["H"], r["Lq"], r["Lk"], r["D"], bool(r["causal"]))


ORT_RE = re.compile(r"ort-(\S+)\s+thr=\d+ B=\s*(\d+) H=(\d+) L=\s*(\d+) D=(\d+) causal=(\d)\s+"
                    r"median\s+([\d.]+) ms")


def attention_round(a, rnd, out):
    passive = {"OMP_WAIT_POLICY": "PASSIVE"}
    txt, _ = run([os.path.join(a.build, "attn-bench"), "--threads", str(a.threads), "--impl",
                  "fused", "--json"], passive)
    rows = json_lines(txt)
    head = rows[0]
    out.append({"round": rnd, "kind": "peak", **head})
    for r in rows[1:]:
        if "ms" in r:
            out.append({"round": rnd, "kind": "attn", "prog": "attn-fused", **r})
    txt, _ = run([os.path.join(a.build, "attn-bench"), "--threads", str(a.threads), "--impl",
                  "fused", "--json", "--dtype", "bf16"], passive)
    for r in json_lines(txt):
        if "ms" in r:
            out.append({"round": rnd, "kind": "attn", "prog": "attn-fused-bf16", **r})
    txt, _ = run([PY, os.path.join(HERE, "torch_attn_bench.py"), "--threads", str(a.threads),
                  "--json"], passive)
    for r in json_lines(txt):
        if "ms" in r:
            out.append({"round": rnd, "kind": "attn", "prog": "torch-math", **r})
    js = os.path.join(SHARED, "peers", "ort_attn_bench.js")
    if shutil.which("node") and os.path.isdir(a.ort_modules) and os.path.exists(js):
        txt, _ = run(["node", js, str(a.threads), "attn23", "mha", "gqa"],
                     {"NODE_PATH": a.ort_modules})
        for m in ORT_RE.finditer(txt):
            v, B, H, L, D, c, ms = m.groups()
            out.append({"round": rnd, "kind": "attn", "prog": "ort-" + v, "op": "fwd",
                        "B": int(B), "H": int(H), "Lq": int(L), "Lk": int(L), "D": int(D),
                        "causal": c == "1", "ms": float(ms)})


TRAIN = [("default, random full rows", []), ("default, real batches", ["--data", DATA]),
         ("MolGPT, random full rows", ["--molgpt"]), ("MolGPT, real batches", ["--molgpt", "--data", DATA])]


def train_round(a, rnd, out):
    mg = os.path.join(a.build, "molgen", "molgen")
    for name, extra in TRAIN:
        txt, _ = run([mg, "bench", "--no-sample", "--batch", "32", "--threads", str(a.threads),
                      "--json"] + extra, {"OMP_WAIT_POLICY": "PASSIVE"})
        j = json_lines(txt)[-1]
        out.append({"round": rnd, "kind": "train", "prog": "molgen", "setting": name, **j["train"]})
        txt, _ = run([mg, "bench", "--no-sample", "--batch", "32", "--threads", str(a.threads),
                      "--json", "--dtype", "bf16"] + extra, {"OMP_WAIT_POLICY": "PASSIVE"})
        out.append({"round": rnd, "kind": "train", "prog": "molgen-bf16", "setting": name,
                    **json_lines(txt)[-1]["train"]})
        targs = ["--batch", "32", "--json"] + (["--molgpt"] if "--molgpt" in extra else []) + \
            (["--data", DATA] if "--data" in extra else [])
        for th, env in ((1, {}), (a.threads, {"OMP_WAIT_POLICY": "PASSIVE"})):
            txt, _ = run([PY, "-m", "molgen.torch_model", "bench",
                          "--threads", str(th)] + targs, env)
            j = json_lines(txt)[-1]
            out.append({"round": rnd, "kind": "train", "prog": "torch-%dt" % th, "setting": name,
                        "tokens_per_s": j["train_tokens_per_sec"]})


def sample_round(a, rnd, out):
    mg = os.path.join(a.build, "molgen", "molgen")
    txt, _ = run([mg, "bench", "--no-train", "--model", MODEL, "--batch", "64", "--threads",
                  str(a.threads), "--sample-n", "512", "--json"], {"OMP_WAIT_POLICY": "PASSIVE"})
    j = json_lines(txt)[-1]
    cfg = {k: j[k] for k in ("n_layer", "d_model", "ctx_len", "vocab_size")}
    for kind in ("sample_kv", "sample_naive"):
        out.append({"round": rnd, "kind": "sample", "prog": "molgen-" + kind[7:], **cfg, **j[kind]})
    txt, _ = run([mg, "bench", "--no-train", "--model", MODEL, "--batch", "64", "--threads",
                  str(a.threads), "--sample-n", "512", "--naive-n", "0", "--dtype", "bf16", "--json"],
                 {"OMP_WAIT_POLICY": "PASSIVE"})
    out.append({"round": rnd, "kind": "sample", "prog": "molgen-kv-bf16", **cfg,
                **json_lines(txt)[-1]["sample_kv"]})
    for kv, n in ((True, 256), (False, 64)):
        txt, _ = run([PY, "-m", "molgen.torch_sample", "--model", MODEL, "-n",
                      str(n), "--batch", "64", "--threads", "1", "--runs", "3", "--json"] +
                     (["--kv"] if kv else []))
        j = json_lines(txt)[-1]
        out.append({"round": rnd, "kind": "sample", "prog": j["impl"], **j})


# The variants part (issue 36's targets): (case, extra attn-bench args, label)
VAR_GQA_DEC = "1,32,1,8192,128,0"   # GQA decoding: 8 K/V heads vs 32
VAR_SPLIT_DEC = "1,8,1,32768,128,0"  # split-KV decoding: 2 threads vs 1
VAR_LONG = ["1,8,1024,1024,64,0", "1,8,2048,2048,64,1", "1,8,4096,4096,64,0",
            "1,8,16384,16384,64,1"]  # the suite's L >= 1024 shapes
VAR_CAUSAL = ["32,8,128,128,32,1", "4,8,512,512,64,1", "1,8,2048,2048,64,1"]  # GQA fwd, H_kv = H/4
VAR_KINDS = [("plain", []), ("softcap", ["--softcap", "30"]), ("alibi", ["--alibi"]),
             ("sinks", ["--sinks"])]


def variants_round(a, rnd, out):
    """attn-bench runs for the variants' targets, one after the other (each
    setting's rows carry prog = "var-<setting>")."""
    bench = os.path.join(a.build, "attn-bench")
    passive = {"OMP_WAIT_POLICY": "PASSIVE"}

    def bench_rows(prog, args, threads=a.threads):
        txt, _ = run([bench, "--threads", str(threads), "--impl", "fused", "--json"] + args,
                     passive)
        for r in json_lines(txt):
            if "ms" in r:
                out.append({"round": rnd, "kind": "var", "prog": prog, "threads": threads, **r})
            elif "stream_gbps" in r and r["stream_gbps"] > 0:  # a decode run's header
                out.append({"round": rnd, "kind": "var-stream", "prog": prog, **r})

    for dt in ("f32", "bf16"):
        for hkv in (8, 32):
            bench_rows("var-gqa-dec-%s-kv%d" % (dt, hkv),
                       ["--dtype", dt, "--kv-heads", str(hkv), "--case", VAR_GQA_DEC])
    for th in (1, 2):
        bench_rows("var-split-dec-%dt" % th, ["--case", VAR_SPLIT_DEC], threads=th)
    for c in VAR_LONG:  # the kinds back to back per shape: drift on a shared host hits all four
        for name, extra in VAR_KINDS:
            bench_rows("var-" + name, extra + ["--case", c])
    args = []
    for c in VAR_CAUSAL:
        args += ["--case", c]
    bench_rows("var-gqa-fwd-kv2", ["--kv-heads", "2"] + args)
    bench_rows("var-gqa-fwd-kv8", args)
    js = os.path.join(HERE, "ort_gqa_bench.js")
    if shutil.which("node") and os.path.isdir(a.ort_modules) and os.path.exists(js):
        txt, _ = run(["node", js, str(a.threads), "--kv-heads-div", "4"] + VAR_CAUSAL,
                     {"NODE_PATH": a.ort_modules})
        for r in json_lines(txt):
            if "ms" in r:
                out.append({"round": rnd, "kind": "var", **r, "prog": "ort-gqa"})


GEMM_RE = re.compile(r"^  (\S.*?)\s+([\d.]+) GFLOP/s\s+([\d.]+) % of peak", re.M)


def isa_round(a, rnd, out):
    """The fp32 products side by side, and libattn forced to its AVX2 row."""
    txt, _ = run(["sh", os.path.join(HERE, "sgemm_candidates.sh"), "1024", str(a.threads), "3", "3"])
    for name, g, frac in GEMM_RE.findall(txt):
        out.append({"round": rnd, "kind": "gemm", "prog": name, "gflops": float(g),
                    "peak_frac": float(frac) / 100})
    bench = os.path.join(a.build, "attn-bench")
    head = json_lines(run([bench, "--threads", "1", "--case", "1,1,16,16,16,0", "--reps", "1",
                           "--json"])[0])[0]
    if head.get("peak_isa") != "avx512":
        return  # the CPU's own rows are the AVX2 (or portable) ones already
    # each pair back to back, this CPU's row first: drift hits both
    for row in ("native", "avx2"):
        env = {"OMP_WAIT_POLICY": "PASSIVE", **({"ATTN_FUSED_ISA": "avx2"} if row == "avx2" else {})}
        txt, _ = run([bench, "--threads", str(a.threads), "--impl", "fused", "--json"], env)
        for r in json_lines(txt)[1:]:
            if "ms" in r:
                out.append({"round": rnd, "kind": "isa-attn", "prog": row, **r})
    mg = os.path.join(a.build, "molgen", "molgen")
    for name, extra in TRAIN:
        if "--data" not in extra:
            continue
        for row in ("native", "avx2"):
            env = {"OMP_WAIT_POLICY": "PASSIVE", **({"ATTN_FUSED_ISA": "avx2"} if row == "avx2" else {})}
            txt, _ = run([mg, "bench", "--no-sample", "--batch", "32", "--threads", str(a.threads),
                          "--json"] + extra, env)
            out.append({"round": rnd, "kind": "isa-train", "prog": row, "setting": name,
                        **json_lines(txt)[-1]["train"]})
    if head.get("bf16_row") != "amx":
        return
    # bf16 on AMX tiles (attn-bench and molgen take them) beside the
    # AVX512_BF16 row forced, back to back
    below = {"ATTN_FUSED_ISA": "avx512bf16", "MOLGEN_GEMM_ISA": "avx512bf16"}
    for row in ("amx", "avx512bf16"):
        env = {"OMP_WAIT_POLICY": "PASSIVE", **(below if row != "amx" else {})}
        txt, _ = run([bench, "--threads", str(a.threads), "--impl", "fused", "--json", "--dtype",
                      "bf16"], env)
        for r in json_lines(txt)[1:]:
            if "ms" in r:
                out.append({"round": rnd, "kind": "amx-attn", "prog": row, **r})
    for name, extra in TRAIN:
        if "--data" not in extra:
            continue
        for row in ("amx", "avx512bf16"):
            env = {"OMP_WAIT_POLICY": "PASSIVE", **(below if row != "amx" else {})}
            txt, _ = run([mg, "bench", "--no-sample", "--batch", "32", "--threads", str(a.threads),
                          "--dtype", "bf16", "--json"] + extra, env)
            out.append({"round": rnd, "kind": "amx-train", "prog": row, "setting": name,
                        **json_lines(txt)[-1]["train"]})


def isa_report(rows, threads, p):
    """Tables of the isa part (nothing when the rows have none)."""
    gm = [r for r in rows if r["kind"] == "gemm"]
    if gm:
        p("\n| fp32 product 1024×1024×1024, %d threads | GFLOP/s | %% of the FMA peak | target |"
          % threads)
        p("|---|---|---|---|")
        for name in dict.fromkeys(r["prog"] for r in gm):
            g = med([r["gflops"] for r in gm if r["prog"] == name])
            f = med([r["peak_frac"] for r in gm if r["prog"] == name])
            tgt = "–"
            if name.startswith("attn avx512") or (name.startswith("attn ") and
                                                  not any(x["prog"] == "attn avx512" for x in gm)):
                tgt = "≥ 80%% of peak: %s" % ("met" if f >= 0.80 else "not met")
            p("| %s | %.1f | %.0f%% | %s |" % (name, g, 100 * f, tgt))
    att = [r for r in rows if r["kind"] == "isa-attn"]
    forced = [r for r in att if r["prog"] == "avx2"]
    if forced:
        p("\n| B,H,Lq,Lk,D,causal | op | fp32 fused ms, this CPU's row | fp32 fused ms, AVX2 forced |"
          " this CPU vs AVX2 |")
        p("|---|---|---|---|---|")
        keys = list(dict.fromkeys((case_key(r), r["op"]) for r in forced))
        for k, op in keys:
            nat = med([r["ms"] for r in att if r["prog"] == "native" and case_key(r) == k
                       and r["op"] == op])
            avx2 = med([r["ms"] for r in forced if case_key(r) == k and r["op"] == op])
            B, H, Lq, Lk, D, c = k
            p("| %d,%d,%d,%d,%d,%s | %s | %.2f | %.2f | %.2f× |" % (
                B, H, Lq, Lk, D, "yes" if c else "no", op, nat, avx2, avx2 / nat))
    tr = [r for r in rows if r["kind"] == "isa-train"]
    if tr:
        p("\n| training fp32, batch 32, real batches | tokens/s, this CPU's row | tokens/s, AVX2 forced |"
          " this CPU vs AVX2 |")
        p("|---|---|---|---|")
        for name, _ in TRAIN:
            f = med([r["tokens_per_s"] for r in tr if r["setting"] == name and r["prog"] == "native"])
            v = med([r["tokens_per_s"] for r in tr if r["setting"] == name and r["prog"] == "avx2"])
            if v == v:
                p("| %s | %.0f | %.0f | %.2f× |" % (name, f, v, f / v))


def variants_report(rows, p):
    """The variants' tables: each figure the median over rounds of
    attn-bench's (or ORT's) median."""
    vr = [r for r in rows if r["kind"] == "var"]
    if not vr:
        return
    st = [r for r in rows if r["kind"] == "var-stream" and r["prog"].startswith("var-gqa-dec")]
    if st:
        p("\nvariants: read bandwidth measured by the GQA decode runs (%d threads), per run: %s "
          "GB/s" % (st[0]["threads"], " / ".join("%.1f" % r["stream_gbps"] for r in st)))

    def pick(prog, key, op="fwd"):
        return [r for r in vr if r["prog"] == prog and r.get("op", "fwd") == op and
                tuple(str(r[x]) for x in ("B", "H", "Lq", "Lk", "D")) == tuple(key.split(",")[:5])]

    def ms(prog, key, op="fwd"):
        return med([r["ms"] for r in pick(prog, key, op)])

    def paired(num, den, key, op="fwd"):
        """median over rounds of num's ms / den's ms in the same round (the
        two ran back to back, so the host's drift between rounds cancels)"""
        a = {r["round"]: r["ms"] for r in pick(num, key, op)}
        b = {r["round"]: r["ms"] for r in pick(den, key, op)}
        return med([a[k] / b[k] for k in a if k in b])

    p("\n| GQA decode B1 H32 D128 Lq1 Lk8192 | dtype | H_kv 8 ms | % of read bandwidth (8 K/V heads' "
      "bytes) | H_kv 32 ms | speedup | target |")
    p("|---|---|---|---|---|---|---|")
    for dt in ("f32", "bf16"):
        f8, f32 = ms("var-gqa-dec-%s-kv8" % dt, VAR_GQA_DEC), ms("var-gqa-dec-%s-kv32" % dt, VAR_GQA_DEC)
        sf = med([r.get("stream_frac", float("nan")) for r in pick("var-gqa-dec-%s-kv8" % dt, VAR_GQA_DEC)])
        sp = paired("var-gqa-dec-%s-kv32" % dt, "var-gqa-dec-%s-kv8" % dt, VAR_GQA_DEC)
        p("| fwd | %s | %.3f | %.0f%% | %.3f | %.2f× | ≥ 80%% and ≥ 3×: %s |" % (
            dt, f8, 100 * sf, f32, sp, "met" if sf >= 0.8 and sp >= 3 else "not met"))
    t1, t2 = ms("var-split-dec-1t", VAR_SPLIT_DEC), ms("var-split-dec-2t", VAR_SPLIT_DEC)
    sp = paired("var-split-dec-1t", "var-split-dec-2t", VAR_SPLIT_DEC)
    p("\n| split-KV decode B1 H8 D128 Lq1 Lk32768 | 1 thread ms | 2 threads ms | speedup | target |")
    p("|---|---|---|---|---|")
    p("| fwd, fp32 | %.3f | %.3f | %.2f× | ≥ 1.8×: %s |" % (t1, t2, sp,
                                                           "met" if sp >= 1.8 else "not met"))
    p("\n| variant cost, B,H,Lq,Lk,D,causal | op | plain ms | softcap 30 | ALiBi | sinks | target |")
    p("|---|---|---|---|---|---|---|")
    for c in VAR_LONG:
        for op in ("fwd", "bwd"):
            base = ms("var-plain", c, op)
            cells, worst = [], 0.0
            for name, _ in VAR_KINDS[1:]:
                v, rel = ms("var-" + name, c, op), paired("var-" + name, "var-plain", c, op)
                cells.append("%.2f (%+.0f%%)" % (v, 100 * (rel - 1)))
                worst = max(worst, rel - 1)
            tgt = ("≤ 10%%: %s" % ("met" if worst <= 0.10 else "not met")) if op == "fwd" else "–"
            p("| %s | %s | %.2f | %s | %s |" % (c, op, base, " | ".join(cells), tgt))
    p("\n(ms: medians over the rounds; speedups and costs: medians over the rounds of the ratio "
      "of the two calls within a round, which ran back to back)")
    p("\n| GQA fwd H_kv = H/4, B,H,Lq,Lk,D,causal | attn ms | attn H_kv = H ms | ORT GQA ms | "
      "vs ORT | target |")
    p("|---|---|---|---|---|---|")
    for c in VAR_CAUSAL:
        g = ms("var-gqa-fwd-kv2", c)
        full = ms("var-gqa-fwd-kv8", c)
        o = ms("ort-gqa", c)
        p("| %s | %.2f | %.2f | %s | %s | ≥ 1.25× ORT: %s |" % (
            c, g, full, "%.2f" % o if o == o else "–",
            "%.2f×" % (o / g) if o == o else "–",
            ("met" if o / g >= 1.25 else "not met") if o == o else "not measured"))


def med(v):
    return statistics.median(v) if v else float("nan")


def report(rows, threads, out=sys.stdout):
    def p(*args):
        print(*args, file=out)

    peaks = [r["peak_gflops"] for r in rows if r["kind"] == "peak"]
    streams = [r.get("stream_gbps", 0) for r in rows if r["kind"] == "peak"]
    peak = med(peaks)
    if peaks:
        p("FMA peak (attn-bench, %d threads), per round: %s GFLOP/s; read bandwidth %s GB/s\n"
          % (threads, " / ".join("%.0f" % p for p in peaks), " / ".join("%.1f" % s for s in streams)))
    # attention
    att = [r for r in rows if r["kind"] == "attn"]
    keys = []
    for r in att:
        if r["prog"] == "attn-fused" and (case_key(r), r["op"]) not in keys:
            keys.append((case_key(r), r["op"]))
    if keys:
        p("| B,H,Lq,Lk,D,causal | op | attn fused ms | % peak | torch-math ms | best ORT ms (op) |"
              " fused vs best peer | target | attn bf16 ms | bf16 vs fp32 | bf16 vs best peer |"
              " bf16 target |")
        p("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k, op in keys:
        def ms_of(prog):
            return med([r["ms"] for r in att if r["prog"] == prog and case_key(r) == k and r["op"] == op])
        f = ms_of("attn-fused")
        frac = med([r["peak_frac"] for r in att if r["prog"] == "attn-fused" and case_key(r) == k
                    and r["op"] == op])
        tm_ = ms_of("torch-math")
        orts = {p: ms_of(p) for p in ("ort-attn23", "ort-mha", "ort-gqa")}
        orts = {p: v for p, v in orts.items() if v == v}
        best_ort = min(orts.items(), key=lambda kv: kv[1]) if orts else None
        peers = [v for v in [tm_] + list(orts.values()) if v == v]
        ratio = min(peers) / f if peers else float("nan")
        B, H, Lq, Lk, D, c = k
        dec = Lq == 1
        if dec:
            g = med([r.get("gbps", float("nan")) for r in att if r["prog"] == "attn-fused"
                     and case_key(r) == k and r["op"] == op])
            sf = med([r.get("stream_frac", float("nan")) for r in att if r["prog"] == "attn-fused"
                      and case_key(r) == k and r["op"] == op])
            pk = "%.1f GB/s = %.0f%% of stream" % (g, 100 * sf)
        else:
            pk = "%.0f%%" % (100 * frac)
        tgt = []
        if op == "fwd" and not dec and peers:
            tgt.append("≥ 1.25× peers: %s" % ("met" if ratio >= 1.25 else "not met"))
        if Lq >= 1024 and not c and not dec:
            need = 0.85 if op == "fwd" else 0.80
            tgt.append("≥ %d%% peak: %s" % (100 * need, "met" if frac >= need else "not met"))
        # bf16 (issue 26): forward >= 1.6x fp32 at L >= 1024 and >= 1.25x
        # every peer (fp32 peers: none here has a fused bf16 attention);
        # backward >= 1.4x fp32
        bf = ms_of("attn-fused-bf16")
        vs32, vspeer = f / bf, (min(peers) / bf if peers else float("nan"))
        btgt = []
        if bf == bf and op == "fwd" and not dec:
            if Lq >= 1024:
                btgt.append("≥ 1.6× fp32: %s" % ("met" if vs32 >= 1.6 else "not met"))
            if peers:
                btgt.append("≥ 1.25× peers: %s" % ("met" if vspeer >= 1.25 else "not met"))
        if bf == bf and op == "bwd" and Lq >= 1024:
            btgt.append("≥ 1.4× fp32: %s" % ("met" if vs32 >= 1.4 else "not met"))
        p("| %d,%d,%d,%d,%d,%s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            B, H, Lq, Lk, D, "yes" if c else "no", op, f, pk,
            "%.2f" % tm_ if tm_ == tm_ else "–",
            "%.2f (%s)" % (best_ort[1], best_ort[0][4:]) if best_ort else "–",
            "%.2f×" % ratio if ratio == ratio else "–", "; ".join(tgt) or "–",
            "%.2f" % bf if bf == bf else "–", "%.2f×" % vs32 if bf == bf else "–",
            "%.2f×" % vspeer if vspeer == vspeer else "–", "; ".join(btgt) or "–"))
    # training
    tr = [r for r in rows if r["kind"] == "train"]
    if tr:
        p("\n| training, batch 32, %d threads | molgen tokens/s | mfu | PyTorch best tokens/s | ratio | target |"
              % threads)
        p("|---|---|---|---|---|---|")
    for name, _ in TRAIN:
        m = [r for r in tr if r["setting"] == name and r["prog"] == "molgen"]
        if not m:
            continue
        rounds = sorted({r["round"] for r in tr if r["setting"] == name})
        best_t = [max(r["tokens_per_s"] for r in tr if r["setting"] == name and r["round"] == x
                      and r["prog"].startswith("torch")) for x in rounds]
        mt, mfu, bt = med([r["tokens_per_s"] for r in m]), med([r["mfu"] for r in m]), med(best_t)
        need = 0.75 if name.startswith("MolGPT") else 0.65
        p("| %s | %.0f | %.0f%% | %.0f | %.2f× | mfu ≥ %d%%: %s |" % (
            name, mt, 100 * mfu, bt, mt / bt, 100 * need, "met" if mfu >= need else "not met"))
    # molgen bf16 training beside fp32 (issue 26: >= 1.4x fp32 tokens/s)
    if [r for r in tr if r["prog"] == "molgen-bf16"]:
        p("\n| training, batch 32, %d threads | molgen fp32 tokens/s | molgen bf16 tokens/s |"
          " bf16 vs fp32 | target |" % threads)
        p("|---|---|---|---|---|")
    for name, _ in TRAIN:
        f32 = med([r["tokens_per_s"] for r in tr if r["setting"] == name and r["prog"] == "molgen"])
        b16 = med([r["tokens_per_s"] for r in tr if r["setting"] == name
                   and r["prog"] == "molgen-bf16"])
        if b16 == b16:
            p("| %s | %.0f | %.0f | %.2f× | ≥ 1.4×: %s |" % (
                name, f32, b16, b16 / f32, "met" if b16 >= 1.4 * f32 else "not met"))
    # sampling
    sm = [r for r in rows if r["kind"] == "sample"]
    kv = [r for r in sm if r["prog"] == "molgen-kv"]
    if kv:
        c = kv[0]
        d, N, V, T = c["d_model"], c["n_layer"], c["vocab_size"], c["ctx_len"]
        tpm = med([r["tokens_per_molecule"] for r in kv])
        # per generated token: 2 x matmul weights, plus Q·K and P·V over the
        # cached positions (on average about half the molecule's length)
        flop_tok = 2 * (12 * N * d * d + V * d) + N * 4 * d * (tpm / 2)
        limit = peak * 1e9 / (flop_tok * tpm)
        if peak != peak:
            p("(no FMA peak measured in this run: the sampling limit needs the attention part)")
        p("\n| sampling, shipped model, batch 64 | molecules/s | fraction of the arithmetic limit |")
        p("|---|---|---|")
        for prog in ("molgen-kv", "molgen-kv-bf16", "molgen-naive", "torch-kv", "torch-naive"):
            v = med([r["molecules_per_s"] for r in sm if r["prog"] == prog])
            p("| %s | %.1f | %s |" % (prog, v, "%.0f%%" % (100 * v / limit) if prog.startswith("molgen-kv")
                                      else "–"))
        mk = med([r["molecules_per_s"] for r in kv])
        p("\nArithmetic limit: %.2f MFLOP per token × %.1f tokens per molecule at %.0f GFLOP/s = "
              "%.0f molecules/s; target ≥ 1,000 molecules/s: %s (%.0f)."
              % (flop_tok / 1e6, tpm, peak, limit, "met" if mk >= 1000 else "not met", mk))
        mb = med([r["molecules_per_s"] for r in sm if r["prog"] == "molgen-kv-bf16"])
        if mb == mb:
            p("bf16 KV sampling: %.0f molecules/s, %.2f× fp32; target ≥ 1,500 molecules/s: %s."
              % (mb, mb / mk, "met" if mb >= 1500 else "not met"))
    variants_report(rows, p)
    isa_report(rows, threads, p)
    amx_report(rows, p)


def amx_report(rows, p):
    """bf16 on AMX tiles beside the AVX512_BF16 row and beside fp32 on this
    CPU's row, the same rounds (nothing without AMX)."""
    att = [r for r in rows if r["kind"] == "amx-attn"]
    f32 = [r for r in rows if r["kind"] == "isa-attn" and r["prog"] == "native"]
    if att:
        p("\n| B,H,Lq,Lk,D,causal | op | bf16 ms, AMX tiles | bf16 ms, AVX512_BF16 | fp32 ms |"
          " AMX vs AVX512_BF16 | AMX bf16 vs fp32 | target (fwd, L ≥ 1024) |")
        p("|---|---|---|---|---|---|---|---|")
        for k, op in dict.fromkeys((case_key(r), r["op"]) for r in att):
            def ms(rs, prog=None):
                return med([r["ms"] for r in rs if case_key(r) == k and r["op"] == op
                            and (prog is None or (r["prog"] == "amx") == (prog == "amx"))])
            x, y, f = ms(att, "amx"), ms(att, "other"), ms(f32)
            B, H, Lq, Lk, D, c = k
            tgt = "–"
            if op == "fwd" and min(Lq, Lk) >= 1024 and f == f:
                tgt = "≥ 1.6×: %s" % ("met" if f / x >= 1.6 else "not met")
            p("| %d,%d,%d,%d,%d,%s | %s | %.2f | %.2f | %.2f | %.2f× | %.2f× | %s |" % (
                B, H, Lq, Lk, D, "yes" if c else "no", op, x, y, f, y / x, f / x, tgt))
    tr = [r for r in rows if r["kind"] == "amx-train"]
    if tr:
        p("\n| training, batch 32, real batches | bf16 tokens/s, AMX tiles |"
          " bf16 tokens/s, AVX512_BF16 | fp32 tokens/s | AMX vs AVX512_BF16 | AMX bf16 vs fp32 |"
          " target |")
        p("|---|---|---|---|---|---|---|")
        for name, _ in TRAIN:
            sel = [r for r in tr if r["setting"] == name]
            x = med([r["tokens_per_s"] for r in sel if r["prog"] == "amx"])
            y = med([r["tokens_per_s"] for r in sel if r["prog"] != "amx"])
            f = med([r["tokens_per_s"] for r in rows if r["kind"] == "isa-train"
                     and r["prog"] == "native" and r["setting"] == name])
            if y == y:
                p("| %s | %.0f | %.0f | %.0f | %.2f× | %.2f× | ≥ 1.4×: %s |" % (
                    name, x, y, f, x / y, x / f, "met" if x / f >= 1.4 else "not met"))


def machine(threads):
    """The raw file's first row: when and where the figures were measured."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    return {"kind": "machine", "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu": cpu,
            "logical_cpus": os.cpu_count(), "threads": threads, "kernel": os.uname().release,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
            "load_average_1min": round(os.getloadavg()[0], 2)}


BEGIN, END = "<!-- speed_report:begin -->", "<!-- speed_report:end -->"


def write_markdown(path, rows, threads, raw):
    """The tables, dated and with the machine, into PATH's marked section."""
    import io
    m = next((r for r in rows if r["kind"] == "machine"), None)
    if m:
        where = ("Measured %s on %s (%d logical CPUs, %d threads, Linux %s, OPENBLAS_CORETYPE=%s; "
                 "load average %.2f at the start)" % (m["date"], m["cpu"], m["logical_cpus"],
                                                       m["threads"], m["kernel"], m["openblas_coretype"],
                                                       m["load_average_1min"]))
    else:
        where = ("Measured on %s (the raw file records no machine; the date is the file's)"
                 % time.strftime("%Y-%m-%d", time.localtime(os.path.getmtime(raw))))
    buf = io.StringIO()
    report(rows, threads, buf)
    part = "%s\n%s; regenerate with `/usr/bin/python3 bench/speed_report.py --markdown %s` (or " \
        "`--report RAW --markdown %s` from a raw file).\n\n%s%s" % (
            BEGIN, where, os.path.relpath(path, REPO), os.path.relpath(path, REPO), buf.getvalue(), END)
    old = open(path).read() if os.path.exists(path) else ""
    if BEGIN in old and END in old:
        page = old[:old.index(BEGIN)] + part + old[old.index(END) + len(END):]
    else:
        page = "# Speed\n\n" + part + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(page)
    os.replace(tmp, path)
    print("(markdown: %s)" % path, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(REPO, "out", "speed"))
    ap.add_argument("--ort-modules", default="/tmp/ort/node_modules")
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--only", choices=("attention", "train", "sample", "variants", "isa"),
                    action="append",
                    help="run only these parts (default all)")
    ap.add_argument("--report", help="print the tables of an earlier raw.jsonl, run nothing")
    ap.add_argument("--markdown", metavar="PATH", help="also write the tables, dated, into PATH (docs/speed.md)")
    a = ap.parse_args()
    if a.report:
        with open(a.report) as f:
            rows = [json.loads(l) for l in f if l.strip()]
        m = next((r for r in rows if r["kind"] == "machine"), None)
        threads = m["threads"] if m else a.threads
        report(rows, threads)
        if a.markdown:
            write_markdown(a.markdown, rows, threads, a.report)
        return 0
    os.makedirs(a.out, exist_ok=True)
    raw = os.path.join(a.out, "raw.jsonl")
    rows = [machine(a.threads)]
    with open(raw, "w") as f:  # this run's measurements only
        f.write(json.dumps(rows[0]) + "\n")
    parts = [("attention", attention_round), ("train", train_round), ("sample", sample_round),
             ("variants", variants_round), ("isa", isa_round)]
    for rnd in range(a.rounds):
        for name, fn in parts:
            if a.only and name not in a.only:
                continue
            t0 = time.time()
            got = []
            fn(a, rnd, got)
            rows += got
            with open(raw, "a") as f:
                for r in got:
                    f.write(json.dumps(r) + "\n")
            print("round %d %s: %.0f s" % (rnd + 1, name, time.time() - t0), file=sys.stderr)
    report(rows, a.threads)
    print("\n(raw measurements: %s)" % raw)
    if a.markdown:
        write_markdown(a.markdown, rows, a.threads, raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
