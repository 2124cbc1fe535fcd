"""Incremental decoding with attn.MultiheadAttention.step: token by token over
a KV cache (an IncrementalState) gives the causal forward's output."""
import numpy as np

import attn

E, H, B, L = 32, 4, 2, 10
mha = attn.MultiheadAttention(E, H, seed=1).eval()
x = np.sin(0.37 * np.arange(B * L * E, dtype=np.float32)).reshape(B, L, E)
full, _ = mha(x, x, x, is_causal=True, need_weights=False)

state = mha.incremental_state(batch_size=B, max_len=L)   # max_step=1
steps = np.concatenate([mha.step(x[:, t:t + 1], state) for t in range(L)], axis=1)
print("lengths", state.lengths.tolist(), "max |step - forward| %.2g" % np.abs(steps - full).max())
state.reset(1)                                            # row 1 starts a new sequence
print("after reset(1):", state)
try:
    mha.step(x[:, :1], state)                             # row 0 is full
except attn.AttnStateError as e:
    print("AttnStateError:", e)
