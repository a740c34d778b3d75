"""A tiny transformer-encoder sequence classifier (pre-norm blocks with nn.MultiheadAttention, padding masks,
masked mean pooling), trained with AdamW and a LambdaLR linear warmup/decay, written for PyTorch.
tests/ports/test_ports.py runs it unchanged under PyTorch and, imports switched, under minidnn.

``main(init_state)`` as in char_lstm_lm.py: returns (initial state, per-step losses, evaluation loss).
"""
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR

PAD = 0


def make_data(n, vocab, max_len, seed):
    """Sequences of random lengths; label 1 when token 3 occurs more often than token 4."""
    rng = np.random.default_rng(seed)
    x = np.zeros((n, max_len), dtype=np.int64)
    y = np.zeros(n, dtype=np.int64)
    for i in range(n):
        length = rng.integers(3, max_len + 1)
        seq = rng.integers(1, vocab, size=length)
        x[i, :length] = seq
        y[i] = int((seq == 3).sum() > (seq == 4).sum())
    return torch.from_numpy(x), torch.from_numpy(y)


class Block(nn.Module):
    def __init__(self, d_model, nhead, dim_ff, dropout=0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, dim_ff), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(dim_ff, d_model))

    def forward(self, x, pad_mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=False)
        x = x + a
        return x + self.ff(self.ln2(x))


class Classifier(nn.Module):
    def __init__(self, vocab, d_model=32, nhead=4, nlayers=2, max_len=16, nclass=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = nn.Parameter(torch.zeros(1, max_len, d_model))
        self.blocks = nn.ModuleList([Block(d_model, nhead, 2 * d_model) for _ in range(nlayers)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, nclass)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x):
        pad_mask = x == PAD
        h = self.tok(x) * math.sqrt(self.tok.embedding_dim) + self.pos[:, :x.size(1)]
        for blk in self.blocks:
            h = blk(h, pad_mask)
        h = self.norm(h)
        keep = (~pad_mask).float().unsqueeze(-1)
        pooled = (h * keep).sum(1) / keep.sum(1)
        return self.head(pooled)


def main(init_state=None, steps=12, batch_size=16, warmup=4):
    vocab, max_len = 10, 16
    x_train, y_train = make_data(batch_size * steps, vocab, max_len, seed=0)
    x_val, y_val = make_data(64, vocab, max_len, seed=1)
    model = Classifier(vocab, max_len=max_len)
    if init_state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init_state.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "pos" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "pos" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.98))
    schedule = lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / (steps - warmup)))
    scheduler = LambdaLR(optimizer, schedule)
    losses = []
    model.train()
    for step in range(steps):
        xb = x_train[step * batch_size:(step + 1) * batch_size]
        yb = y_train[step * batch_size:(step + 1) * batch_size]
        logits = model(xb)
        loss = F.cross_entropy(logits, yb, label_smoothing=0.0)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(x_val)
        val_loss = F.cross_entropy(logits, y_val).item()
        acc = (logits.argmax(dim=1) == y_val).float().mean().item()
    assert 0.0 <= acc <= 1.0
    return start, losses, val_loss


if __name__ == "__main__":
    _, losses, val = main()
    print("losses", [round(v, 4) for v in losses], "eval", round(val, 4))
