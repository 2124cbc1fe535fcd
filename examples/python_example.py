"""The README's Python example: attn next to PyTorch's interfaces."""
import numpy as np
import attn

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 4, 5, 8), dtype=np.float32) for _ in range(3))
out, w = attn.scaled_dot_product_attention(q, k, v, is_causal=True, need_weights=True)
print("out", out.shape, "weights", w.shape, "path:", attn.last_path()[0])
print("row 2 of head 0:", np.round(w[0, 0, 2], 4))

mha = attn.MultiheadAttention(embed_dim=16, num_heads=4, seed=1)
x = rng.standard_normal((2, 5, 16), dtype=np.float32)
causal = np.triu(np.ones((5, 5), bool), 1)           # torch convention: True = masked
y, avg = mha(x, x, x, attn_mask=causal)
dx, _, _ = mha.backward(np.ones_like(y))               # gradients of sum(y)
print("mha out", y.shape, "avg weights", avg.shape, "d_x", dx.shape)
print("grads:", sorted(mha.grads))
try:
    attn.MultiheadAttention(embed_dim=10, num_heads=4)
except ValueError as e:
    print("ValueError:", e)
