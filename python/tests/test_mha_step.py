"""MultiheadAttention.step (incremental causal decoding over an
IncrementalState) against torch.nn.MultiheadAttention in float64 with a
causal mask over each row's whole prefix (the oracle; PyTorch has no
incremental method), and against attn's own causal forward."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="PyTorch (Debian python3-torch) is the oracle here")

import attn
from _oracle import check_close, rand
from test_mha import torch_twin


def causal_ref(mha, x):
    """torch float64 causal self-attention of x [B, L, E] (batch first)."""
    L = x.shape[1]
    tm = torch_twin(mha)
    t = torch.from_numpy(x.astype(np.float64))
    if not mha.batch_first:
        t = t.transpose(0, 1)
    mask = torch.triu(torch.ones(L, L, dtype=torch.bool), 1)  # True = not allowed
    out, _ = tm(t, t, t, attn_mask=mask, need_weights=False)
    if not mha.batch_first:
        out = out.transpose(0, 1)
    return out.detach().numpy()


def make(rng, E=16, H=4, batch_first=True):
    mha = attn.MultiheadAttention(E, H, batch_first=batch_first, seed=3).eval()
    mha.in_proj_bias = rand(rng, 3 * E, scale=0.5)
    mha.out_proj_bias = rand(rng, E, scale=0.5)
    return mha


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_step_matches_causal_forward(chunk):
    rng = np.random.default_rng(chunk)
    B, L, E = 3, 23, 16
    mha = make(rng, E)
    x = rand(rng, B, L, E)
    ref = causal_ref(mha, x)
    state = mha.incremental_state(B, L, max_step=chunk)
    outs = []
    for t0 in range(0, L, chunk):
        outs.append(mha.step(x[:, t0:t0 + chunk], state))
    got = np.concatenate(outs, axis=1)
    assert state.lengths.tolist() == [L] * B
    check_close("mha_step/chunk%d" % chunk, got, ref)
    full, _ = mha(x, x, x, is_causal=True, need_weights=False)
    check_close("mha_step/forward", full, ref)


def test_prefill_in_one_step():
    rng = np.random.default_rng(7)
    B, L, E = 2, 19, 16
    mha = make(rng, E)
    x = rand(rng, B, L, E)
    state = mha.incremental_state(B, L, max_step=L)
    check_close("mha_step/prefill", mha.step(x, state), causal_ref(mha, x))
    assert state.lengths.tolist() == [L, L]


def test_rows_at_different_positions_and_restart():
    rng = np.random.default_rng(11)
    B, L, E = 3, 12, 16
    mha = make(rng, E)
    seqs = rand(rng, B, L, E)
    ref = causal_ref(mha, seqs)
    state = mha.incremental_state(B, L)
    # row 0 runs alone for 4 positions; then all rows step together, rows
    # 1 and 2 from their start; row 2 is restarted once at position 5
    got = np.zeros((B, L, E), np.float32)
    for t in range(4):
        got[0, t] = mha.step(seqs[:1, t:t + 1], state)[0, 0]
    pos = [4, 0, 0]
    restarted = False
    while pos[0] < L:
        if pos[2] == 5 and not restarted:
            state.reset(2)
            pos[2], restarted = 0, True
        x = np.stack([seqs[r, pos[r]] for r in range(B)])[:, None]
        y = mha.step(x, state)
        for r in range(B):
            got[r, pos[r]] = y[r, 0]
            pos[r] += 1
    assert state.lengths.tolist() == pos
    for r in range(B):
        n = pos[r]
        check_close("mha_step/ragged", got[r, :n], ref[r, :n])


def test_layouts():
    rng = np.random.default_rng(5)
    L, E = 6, 8
    for batch_first in (True, False):
        mha = make(rng, E, 2, batch_first)
        x = rand(rng, 2, L, E)
        ref = causal_ref(mha, x)  # [B, L, E]
        state = mha.incremental_state(2, L, max_step=3)
        if batch_first:
            got = np.concatenate([mha.step(x[:, i:i + 3], state) for i in (0, 3)], axis=1)
        else:  # [L, B, E] in and out
            xt = x.transpose(1, 0, 2)
            got = np.concatenate([mha.step(xt[i:i + 3], state) for i in (0, 3)], axis=0)
            got = got.transpose(1, 0, 2)
        check_close("mha_step/layout", got, ref)
    mha = make(rng, E, 2)
    x = rand(rng, L, E)
    state = mha.incremental_state(1, L)
    got = np.stack([mha.step(x[i:i + 1], state)[0] for i in range(L)])
    check_close("mha_step/unbatched", got, causal_ref(mha, x[None])[0])


def test_refusals():
    rng = np.random.default_rng(2)
    E = 8
    mha = make(rng, E, 2)
    state = mha.incremental_state(2, 3)
    x = rand(rng, 2, 1, E)
    for _ in range(3):
        mha.step(x, state)
    with pytest.raises(attn.AttnStateError, match="full"):
        mha.step(x, state)
    assert state.lengths.tolist() == [3, 3]
    state.reset()
    with pytest.raises(attn.AttnError, match="max_step"):
        mha.step(rand(rng, 2, 2, E), state)
    with pytest.raises(attn.AttnError, match="rows"):
        mha.step(rand(rng, 3, 1, E), state)
    with pytest.raises(ValueError, match="must be"):
        mha.step(rand(rng, 2, 1, E + 1), state)
    with pytest.raises(TypeError):
        mha.step(x, None)
    mha.train()
    mha.dropout = 0.1
    with pytest.raises(ValueError, match="eval"):
        mha.step(x, state)
    cross = attn.MultiheadAttention(E, 2, kdim=4)
    with pytest.raises(attn.AttnError, match="self-attention"):
        cross.incremental_state(2, 3)
    other = attn.MultiheadAttention(2 * E, 2).eval()
    with pytest.raises(attn.AttnError, match="does not match"):
        other.step(rand(rng, 2, 1, 2 * E), state)
    with pytest.raises(attn.AttnError):
        mha.incremental_state(0, 3)
    assert state.lengths.tolist() == [0, 0]
