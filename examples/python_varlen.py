"""Packed variable-length attention from Python: three sequences in one call."""
import numpy as np
import attn

rng = np.random.default_rng(0)
lens = [3, 5, 2]                                  # three sequences, packed back to back
cu = np.concatenate([[0], np.cumsum(lens)])       # cu_seqlens: [0 3 8 10]
q = rng.standard_normal((sum(lens), 2, 4)).astype(np.float32)  # (total, H, E)
out, w = attn.scaled_dot_product_attention_varlen(q, q, q, cu, is_causal=True,
                                                  need_weights=True)
print("cu_seqlens", cu, "out", out.shape, "weights", [x.shape for x in w])
print("sequence 1, head 0, row 2:", np.round(w[1][0, 2], 4))
print("path:", attn.last_path()[1])
dq, dk, dv = attn.scaled_dot_product_attention_varlen_grad(np.ones_like(out), q, q, q, cu,
                                                           is_causal=True)
print("dq", dq.shape)
try:
    attn.scaled_dot_product_attention_varlen(q, q, q, [0, 3, 2, 10])
except ValueError as e:
    print("ValueError:", e)
