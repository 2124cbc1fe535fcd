"""attn-bench's decode bandwidth figure: the bytes behind gbps are the ones
the call must move, counted here from the shapes and dtypes (K and V read,
2 bytes an element in bf16; the backward also writes fp32 dK and dV)."""
import json
import os
import subprocess

import pytest

BUILD = os.path.dirname(os.environ.get("ATTN_LIBRARY", "")) or os.path.join(
    os.path.dirname(__file__), "..", "..", "build")
BENCH = os.path.join(BUILD, "attn-bench")


@pytest.mark.skipif(not os.path.exists(BENCH), reason="attn-bench not built")
@pytest.mark.parametrize("dtype,elem", [("f32", 4), ("bf16", 2)])
def test_decode_gbps_counts_the_bytes_moved(dtype, elem):
    B, H, Hkv, Lk, D = 1, 4, 2, 512, 64
    out = subprocess.run([BENCH, "--threads", "1", "--impl", "fused", "--reps", "2", "--json",
                          "--dtype", dtype, "--kv-heads", str(Hkv),
                          "--case", "%d,%d,1,%d,%d,0" % (B, H, Lk, D)],
                         capture_output=True, text=True, check=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{") and '"op"' in l]
    kv = 2 * B * Hkv * Lk * D  # K and V elements
    want = {"fwd": kv * elem, "bwd": kv * elem + kv * 4}
    assert sorted(r["op"] for r in rows) == ["bwd", "fwd"]
    for r in rows:
        moved = r["gbps"] * 1e9 * r["ms"] * 1e-3
        # gbps and ms are printed rounded to 2 and 3 decimals
        assert moved == pytest.approx(want[r["op"]], rel=5e-3 + 0.0006 / r["ms"]), r
