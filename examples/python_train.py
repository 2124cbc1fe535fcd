"""The README's Python training example: fit attn.MultiheadAttention to a
teacher layer by SGD, with attention dropout, using mha.backward()."""
import numpy as np
import attn

rng = np.random.default_rng(0)
teacher = attn.MultiheadAttention(32, 4, seed=1)
student = attn.MultiheadAttention(32, 4, dropout=0.1, seed=2)
causal = np.triu(np.ones((16, 16), bool), 1)              # True = masked (torch)
teacher.eval()
for step in range(301):
    x = rng.uniform(-1, 1, (8, 16, 32)).astype(np.float32)
    target, _ = teacher(x, x, x, attn_mask=causal, need_weights=False)
    y, _ = student(x, x, x, attn_mask=causal, need_weights=False)  # training mode: dropout on
    loss = np.mean((y - target) ** 2)
    student.backward(2 * (y - target) / y.size)
    student.parameters_buffer -= 2.0 * student.grads_buffer
    if step % 50 == 0:
        print(f"step {step:3d}  loss {loss:.6f}")
