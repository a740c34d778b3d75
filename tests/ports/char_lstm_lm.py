"""A character-level LSTM language model trained with truncated BPTT (in the style of PyTorch's
word_language_model example), written for PyTorch.  tests/ports/test_ports.py runs this file unchanged under
PyTorch and, with only the import lines switched to minidnn, under minidnn, and compares the losses.

``main(init_state)``: ``init_state`` (a dict of NumPy arrays) replaces the initial weights so that both runs
start from the same point; returns (initial state as NumPy arrays, per-step losses, evaluation loss).
"""
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import OneCycleLR

TEXT = ("it was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of light, "
        "it was the season of darkness, it was the spring of hope, it was the winter of despair.")


class CharLM(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(self.nlayers, bsz, self.nhid),
                torch.zeros(self.nlayers, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).transpose(0, 1).contiguous()     # (the example's .t(): Tensor.t is still missing)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def main(init_state=None, epochs=2, bptt=12, batch_size=4, clip=0.25):
    chars = sorted(set(TEXT))
    ids = torch.from_numpy(np.array([chars.index(c) for c in TEXT], dtype=np.int64))
    train_data = batchify(ids, batch_size)
    model = CharLM(len(chars), 16, 24, 2)
    if init_state is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init_state.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    criterion = nn.NLLLoss()
    optimizer = torch.optim.RMSprop(model.parameters(), lr=0.002, momentum=0.9, alpha=0.95)
    steps_per_epoch = len(range(0, train_data.size(0) - 1, bptt))
    scheduler = OneCycleLR(optimizer, max_lr=0.005, epochs=epochs, steps_per_epoch=steps_per_epoch)
    losses = []
    for epoch in range(epochs):
        model.train()
        hidden = model.init_hidden(batch_size)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, bptt)):
            data, targets = get_batch(train_data, i, bptt)
            hidden = repackage_hidden(hidden)
            optimizer.zero_grad()
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
    model.eval()
    total = 0.0
    with torch.no_grad():
        hidden = model.init_hidden(batch_size)
        for i in range(0, train_data.size(0) - 1, bptt):
            data, targets = get_batch(train_data, i, bptt)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output, targets).item()
    return start, losses, total / (len(train_data) - 1)


if __name__ == "__main__":
    _, losses, val = main()
    print("losses", [round(v, 4) for v in losses], "eval", round(val, 4))
