"""The README's attn.torch example: attn inside a PyTorch model, with autograd."""
import torch
from torch import nn

import attn.torch

torch.manual_seed(0)
q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))
out = attn.torch.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1, seed=7)
out.sum().backward()                                       # libattn's backward
print("out", tuple(out.shape), "q.grad", tuple(q.grad.shape))

# A drop-in for torch.nn.MultiheadAttention: same parameters and state_dict
layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
x = torch.randn(8, 20, 32)
mask = nn.Transformer.generate_square_subsequent_mask(20)
before = layer(x, src_mask=mask)
mha = attn.torch.MultiheadAttention(32, 4, batch_first=True)
mha.load_state_dict(layer.self_attn.state_dict())
layer.self_attn = mha
after = layer(x, src_mask=mask)
print("max |torch - attn| %.1e" % (before - after).abs().max())
opt = torch.optim.SGD(layer.parameters(), lr=0.1)
loss = after.pow(2).mean()
loss.backward()
opt.step()
print("loss %.4f -> %.4f" % (loss, layer(x, src_mask=mask).pow(2).mean()))

try:
    mha(x.double(), x.double(), x.double())
except NotImplementedError as e:                          # attn.torch.UnsupportedError
    print(type(e).__name__ + ":", e)
