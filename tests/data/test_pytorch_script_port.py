"""A PyTorch data-loading script (PyTorch's reproducibility recipe: a seeded Generator for random_split and
the loader, worker_init_fn seeding NumPy and random from torch.initial_seed(), workers, drop_last,
WeightedRandomSampler for class balance) run twice: as written for PyTorch, and with only the imports
changed to minidnn.  The random streams differ, so what is compared is everything that must not: sizes,
shapes, dtypes, coverage, class balance, and that each framework replays itself exactly."""
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import random
    import numpy
    {imports}

    def seed_worker(worker_id):
        worker_seed = torch.initial_seed() % 2**32
        numpy.random.seed(worker_seed)
        random.seed(worker_seed)

    class Noisy(Dataset):
        """Per-sample noise from numpy and random in __getitem__: needs the workers seeded."""
        def __init__(self, x, y):
            self.x, self.y = x, y
        def __len__(self):
            return len(self.y)
        def __getitem__(self, i):
            return self.x[i] + numpy.float32(numpy.random.rand() * 1e-3 + random.random() * 1e-3), int(self.y[i])

    torch.manual_seed(0)
    x = numpy.arange(100 * 4, dtype=numpy.float32).reshape(100, 4)
    y = numpy.arange(100) % 4
    g = torch.Generator()
    g.manual_seed(0)
    train, val = random_split(Noisy(x, y), [0.8, 0.2], generator=g)
    loader = DataLoader(train, batch_size=16, shuffle=True, num_workers=2, worker_init_fn=seed_worker,
                        generator=g, drop_last=True)
    epochs = []
    for epoch in range(2):
        epochs.append([(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in loader])
    val_batches = [(xb.numpy().copy(), yb.numpy().copy()) for xb, yb in DataLoader(val, batch_size=8)]

    counts = numpy.bincount(y[:80], minlength=4).astype(numpy.float64)
    weights = [1.0 / counts[c] for c in y[:80]]
    balanced = DataLoader(TensorDataset(torch.tensor(x[:80]), torch.tensor(y[:80])), batch_size=40,
                          sampler=WeightedRandomSampler(weights, num_samples=4000, replacement=True, generator=g))
    drawn = numpy.concatenate([yb.numpy() for _, yb in balanced])
    result = dict(epochs=epochs, val=val_batches, drawn=drawn, train_indices=list(train.indices),
                  val_indices=list(val.indices))
''')

IMPORTS = {
    "torch": "import torch\nfrom torch.utils.data import DataLoader, Dataset, TensorDataset, random_split, "
             "WeightedRandomSampler",
    "minidnn": "import minidnn as torch\nfrom minidnn.utils.data import DataLoader, Dataset, TensorDataset, "
               "random_split, WeightedRandomSampler",
}


def run(framework):
    namespace = {"__name__": f"port_{framework}"}
    exec(compile(SCRIPT.format(imports=IMPORTS[framework]), f"<port {framework}>", "exec"), namespace)
    return namespace["result"]


def test_pytorch_data_script_runs_with_only_the_imports_changed():
    theirs, ours, ours_again = run("torch"), run("minidnn"), run("minidnn")
    for r in (theirs, ours):
        assert len(r["train_indices"]) == 80 and len(r["val_indices"]) == 20
        assert sorted(r["train_indices"] + r["val_indices"]) == list(range(100))
        assert [len(e) for e in r["epochs"]] == [5, 5]                       # 80 // 16, drop_last
        for epoch in r["epochs"]:
            seen = np.concatenate([yb for _, yb in epoch])
            assert len(seen) == 80
            for xb, yb in epoch:
                assert xb.shape == (16, 4) and xb.dtype == np.float32 and yb.dtype == np.int64
        assert [b[0].shape for b in r["val"]] == [(8, 4), (8, 4), (4, 4)]
        freq = np.bincount(r["drawn"], minlength=4) / len(r["drawn"])
        assert np.all(np.abs(freq - 0.25) < 0.03)                            # balanced classes
    # each epoch covers the training split once (the noise is < 2e-3, the rows are 4 apart)
    train_rows = np.sort(np.asarray(ours["train_indices"]))
    for epoch in ours["epochs"]:
        rows = np.sort(np.concatenate([np.rint(xb[:, 0] / 4).astype(int) for xb, _ in epoch]))
        assert set(rows) <= set(train_rows) and len(set(rows)) == 80
    # minidnn replays itself exactly, worker noise included
    for a, b in zip(ours["epochs"], ours_again["epochs"]):
        for (xa, ya), (xb, yb) in zip(a, b):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
