"""Generate the teaching notebooks from the cell lists below, which are the source of truth.

    python notebooks/_build.py            # (re)write notebooks/*.ipynb, outputs empty
    python notebooks/_build.py --check    # exit 1 if a committed notebook differs from what this file makes

Edit the cells here, not in Jupyter, so that a review reads plain Python and the notebooks in git never
carry outputs.  Cell ids are fixed ("cell-00", ...) so regenerating an unchanged notebook changes nothing.
CI executes every notebook top to bottom (tests/test_notebooks.py); keep each one quick on a CPU.
"""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


def md(text):
    return "markdown", text


def code(text):
    return "code", text


NOTEBOOKS = {}

# ---------------------------------------------------------------------------------------------------------
NOTEBOOKS["01_autograd_from_scratch"] = [
    md("""
    # 1. Autograd from scratch

    Training a network means computing the gradient of one number, the loss, with respect to thousands of
    parameters. Doing it by hand for every model is hopeless; doing it numerically (nudge each parameter,
    re-run the model) costs one forward pass per parameter. **Reverse-mode automatic differentiation**
    gets all of them for about the price of one extra pass.

    The idea fits in three sentences. While you compute, minidnn *records* every operation in a graph.
    `backward()` then walks that graph from the loss back to the inputs, in reverse order. At each node it
    applies the chain rule: the gradient flowing out of the node times the node's local derivative.

    This notebook looks inside that graph, draws it, adds a new operation to it, takes gradients of
    gradients, and checks gradients against finite differences.
    """),
    code("""
    import numpy as np
    import matplotlib.pyplot as plt
    import minidnn as mdn
    from minidnn import autograd
    from minidnn.data.datasets import load_digits

    mdn.manual_seed(0)
    %matplotlib inline
    """),
    md("""
    ## The recorded graph

    A tensor created with `requires_grad=True` is a *leaf*: a value we want gradients for. Every result
    computed from it carries `grad_fn`, the node that made it. Each node points to the nodes of its inputs
    through `next_functions` (pairs `(node, output_index)`); a leaf is reached through an `AccumulateGrad`
    node, whose job is to add the arriving gradient into `leaf.grad`.
    """),
    code("""
    x = mdn.tensor(2.0, requires_grad=True)
    y = x * x + 3 * x          # y = x^2 + 3x, so dy/dx = 2x + 3 = 7 at x = 2

    print("x is a leaf:", x.is_leaf, "  x.grad_fn:", x.grad_fn)
    print("y.grad_fn:", y.grad_fn)
    print("y.grad_fn.next_functions:", y.grad_fn.next_functions)
    """),
    md("""
    Walking `next_functions` from `y` visits the whole graph. An explicit stack (not recursion) keeps the
    walk safe for graphs with a hundred thousand nodes, which is also how minidnn's backward engine does it.
    """),
    code("""
    def print_graph(tensor):
        stack = [(tensor.grad_fn, 0)]
        while stack:
            node, depth = stack.pop()
            print("    " * depth + node.name())
            for child, _ in reversed(node.next_functions):
                if child is not None:
                    stack.append((child, depth + 1))

    print_graph(y)
    """),
    code("""
    y.backward()
    print("dy/dx =", x.grad.item())
    """),
    md("""
    ## A real graph: logistic regression on one batch of digits

    The digits bundled with minidnn (UCI's optdigits, as in scikit-learn) are 8x8 grey images of handwritten digits.
    A linear classifier on the 64 pixels
    already builds a graph worth drawing. `minidnn.viz.to_dot` turns the graph into Graphviz's DOT text:
    blue boxes are leaves (labelled with the names we pass), grey ellipses are backward nodes, the green box
    is the output.
    """),
    code("""
    images, labels = load_digits("train", as_tensors=True)
    x_batch, y_batch = images[:32].reshape(32, 64), labels[:32]

    W = (mdn.randn(64, 10) * 0.01).requires_grad_()
    b = mdn.zeros(10, requires_grad=True)
    loss = mdn.nn.functional.cross_entropy(x_batch @ W + b, y_batch)

    dot = mdn.viz.to_dot(loss, params={"W": W, "b": b}, show_saved=True)
    print(dot)
    """),
    md("""
    `minidnn.viz.draw` saves that text as `logreg_graph.dot` and, where Graphviz's `dot` program is installed
    (`apt-get install graphviz`, `brew install graphviz`, `conda install graphviz`), renders it to a PNG that we
    show below. Without Graphviz it says how to get it, and the `.dot` file opens in any Graphviz viewer.
    """),
    code("""
    from IPython.display import Image

    path = mdn.viz.draw(dot, "logreg_graph.png")     # logreg_graph.dot always; the .png when Graphviz is here
    if path.endswith(".png"):
        display(Image(filename=path))
    else:
        print(f"no picture without Graphviz: the DOT source is in {path}")
    """),
    code("""
    loss.backward()
    print("W.grad:", W.grad.shape, " b.grad:", b.grad.shape)
    # The gradient of the mean cross entropy w.r.t. the bias is mean(softmax - one_hot): it sums to zero.
    print("sum of b.grad:", float(b.grad.sum()))
    """),
    md("""
    ## A new operation: a custom `Function`

    To add an operation, write its forward and its backward. `forward(ctx, ...)` computes the result and
    stores in `ctx` what backward will need; `backward(ctx, grad_output)` returns one gradient per input.

    Our example is **soft thresholding**, the proximal operator of the L1 norm used in sparse coding:
    `y = sign(x) * max(|x| - lam, 0)`. Its derivative is 1 where `|x| > lam` and 0 elsewhere. Writing the
    backward with Tensor operations (not raw NumPy) keeps it differentiable itself.
    """),
    code("""
    class SoftThreshold(autograd.Function):
        @staticmethod
        def forward(ctx, x, lam):
            ctx.save_for_backward(x)
            ctx.lam = lam                      # a plain number: kept on ctx, no gradient
            return x.sign() * (x.abs() - lam).clamp(min=0)

        @staticmethod
        def backward(ctx, grad_y):
            (x,) = ctx.saved_tensors
            passes = (x.abs() > ctx.lam).astype(grad_y.dtype)
            return grad_y * passes, None       # no gradient for lam

    x = mdn.linspace(-2, 2, 9, requires_grad=True)
    y = SoftThreshold.apply(x, 0.5)
    y.sum().backward()
    print("x      ", x.numpy())
    print("y      ", y.numpy())
    print("dy/dx  ", x.grad.numpy())
    print("node:  ", y.grad_fn.name())
    """),
    md("""
    ## Checking a backward: `gradcheck`

    A wrong backward does not crash; it silently trains badly. `gradcheck` compares the analytical gradient
    with central finite differences `(f(x + eps) - f(x - eps)) / 2 eps`. It needs float64: in float32 the
    rounding error of the difference is larger than the tolerance. Here is the correct op, then a buggy
    copy whose backward forgot that the gradient is zero inside the threshold.
    """),
    code("""
    x64 = mdn.randn(20, dtype=mdn.float64, requires_grad=True)
    print("SoftThreshold passes gradcheck:", autograd.gradcheck(lambda t: SoftThreshold.apply(t, 0.5), (x64,)))

    class BuggySoftThreshold(SoftThreshold):
        @staticmethod
        def backward(ctx, grad_y):
            return grad_y, None                # wrong: the identity everywhere

    try:
        autograd.gradcheck(lambda t: BuggySoftThreshold.apply(t, 0.5), (x64,))
    except autograd.GradcheckError as error:
        print("caught:", error)
    """),
    md("""
    ## Gradients of gradients

    Because every backward is written with Tensor operations, running backward with `create_graph=True`
    *records* the backward pass as a new graph, which we can differentiate again. For `tanh`:
    `tanh' = 1 - tanh^2`, `tanh'' = -2 tanh (1 - tanh^2)`, and so on. Four lines give all of them.
    """),
    code("""
    x = mdn.linspace(-4, 4, 200, requires_grad=True)
    curves = [x.tanh()]
    for order in range(3):
        (g,) = autograd.grad(curves[-1].sum(), x, create_graph=True)
        curves.append(g)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for order, c in enumerate(curves):
        ax.plot(x.detach().numpy(), c.detach().numpy(), label=["tanh", "1st", "2nd", "3rd"][order])
    ax.legend(); ax.grid(alpha=0.3); ax.set_title("tanh and its derivatives, by repeated backward")
    plt.show()

    t = np.tanh(x.detach().numpy())
    print("2nd derivative matches -2 tanh (1 - tanh^2):",
          np.allclose(curves[2].detach().numpy(), -2 * t * (1 - t ** 2), atol=1e-5))
    """),
    md("""
    `gradgradcheck` checks the second derivative the same way, by finite differences of the gradient. Our
    `SoftThreshold` passes too: its backward is itself made of differentiable operations.
    """),
    code("""
    print(autograd.gradgradcheck(lambda t: SoftThreshold.apply(t, 0.5) ** 2, (x64,)))
    """),
    md("""
    **Summary.** The forward pass records nodes; `backward` visits them in reverse topological order and
    applies each node's local chain rule; new operations are a `Function` with a forward and a backward;
    `gradcheck` is the test every backward must pass. `examples/custom_layer.py` takes the next step:
    a learnable Swish layer built the same way and trained on the digits.
    """),
]

# ---------------------------------------------------------------------------------------------------------
NOTEBOOKS["02_convolution_algorithms"] = [
    md("""
    # 2. Four ways to compute one convolution

    A convolution layer slides `K` small filters over an image with `C` channels:

    `y[n, k, i, j] = sum over c, r, s of x[n, c, i + r, j + s] * w[k, c, r, s]`

    (deep learning's "convolution" is really cross-correlation: no kernel flip). The formula fixes the
    result, not the method. cuDNN offers several **algorithms** and picks one per problem; minidnn's backend
    has the same design and names, on plain NumPy arrays:

    | algorithm | idea |
    |---|---|
    | `GEMM` (the reference) | copy every sliding window into a row of a matrix (*im2col*), then one matrix product |
    | `DIRECT` | for each kernel tap (r, s): a shifted slice of x times a small weight matrix, accumulated |
    | `FFT` | convolution theorem: pointwise products in the frequency domain |
    | `WINOGRAD_NONFUSED` | Winograd's F(2x2, 3x3): 16 multiplies per 2x2 output tile instead of 36 |

    No Tensors and no autograd here: just arrays, as a cuDNN user would call it.
    """),
    code("""
    import time
    import numpy as np
    import matplotlib.pyplot as plt
    from minidnn import backend as B
    from minidnn.data.datasets import load_digits
    from minidnn.data import transforms as T

    %matplotlib inline
    Fwd, Data, Filter = B.ConvolutionFwdAlgo, B.ConvolutionBwdDataAlgo, B.ConvolutionBwdFilterAlgo
    """),
    md("""
    ## Real images, classic filters

    64 digits upsampled to 32x32, and four hand-made 3x3 filters: horizontal and vertical Sobel edges, a
    blur and a sharpen. `w` has cuDNN's layout `(K, C, R, S)`.
    """),
    code("""
    digits = load_digits("train")
    x = T.Upsample(4)(digits.data[:64])                      # (64, 1, 32, 32) float32
    sobel = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32)
    filters = {"edges |": sobel, "edges -": sobel.T, "blur": np.full((3, 3), 1 / 9, np.float32),
               "sharpen": np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], np.float32)}
    w = np.stack(list(filters.values()))[:, None]           # (4, 1, 3, 3)
    conv = B.ConvolutionDescriptor(padding=1)                # "same" size output

    y = B.convolution_forward(None, x, w, conv)              # handle None: the default one for x's device
    print("x", x.shape, "w", w.shape, "-> y", y.shape)

    fig, axes = plt.subplots(1, 5, figsize=(11, 2.4))
    axes[0].imshow(x[0, 0], cmap="gray_r"); axes[0].set_title("digit")
    for ax, name, img in zip(axes[1:], filters, y[0]):
        ax.imshow(img, cmap="RdBu"); ax.set_title(name)
    for ax in axes: ax.axis("off")
    plt.show()
    """),
    md("""
    ## im2col + GEMM, by hand

    The reference algorithm in ten lines: pad, view every 3x3 window as a row (`sliding_window_view`
    copies nothing), and one matrix product with the filters flattened to columns. Its result is what
    `GEMM` returns.
    """),
    code("""
    x_pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(x_pad, (3, 3), axis=(2, 3))  # (N, C, H, W, 3, 3)
    N, C, H, W_, R, S = windows.shape
    cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(N * H * W_, C * R * S)       # the im2col matrix
    y_mine = (cols @ w.reshape(len(w), -1).T).reshape(N, H, W_, -1).transpose(0, 3, 1, 2)
    print("im2col matrix:", cols.shape, "  max |difference| from GEMM:",
          np.abs(y_mine - B.convolution_forward(None, x, w, conv, algo=Fwd.GEMM)).max())
    """),
    md("""
    ## Every algorithm, same answer

    Each algorithm is run explicitly with `algo=`. They differ only by floating-point rounding (FFT and
    Winograd transform the data, so their rounding is a little larger).
    """),
    code("""
    ALGORITHMS = {  # one name per family: forward / backward data / backward filter enums
        "GEMM": (Fwd.GEMM, Data.ALGO_1, Filter.ALGO_1),
        "DIRECT": (Fwd.DIRECT, Data.ALGO_0, Filter.ALGO_0),
        "FFT": (Fwd.FFT, Data.FFT, Filter.FFT),
        "WINOGRAD_NONFUSED": (Fwd.WINOGRAD_NONFUSED, Data.WINOGRAD_NONFUSED, Filter.WINOGRAD_NONFUSED),
    }
    reference = B.convolution_forward(None, x, w, conv, algo=Fwd.GEMM)
    for name, (fwd, _, _) in ALGORITHMS.items():
        out = B.convolution_forward(None, x, w, conv, algo=fwd)
        print(f"{name:18s} max |y - y_GEMM| = {np.abs(out - reference).max():.2e}")
    """),
    md("""
    ## Backward = adjoint

    For fixed `w`, the convolution is a linear map `x -> A x`. Backpropagation needs `A^T dy`
    (`convolution_backward_data`), and, since the map is also linear in `w`, the adjoint in `w`
    (`convolution_backward_filter`). Adjoints are defined by one identity that we can check with random
    vectors, no reference implementation needed:

    `<conv(x, w), dy>  ==  <x, backward_data(w, dy)>  ==  <w, backward_filter(x, dy)>`

    All three numbers are the same sum `sum x[..] w[..] dy[..]`, grouped differently. In float64 they agree
    to ~1e-12 for every algorithm, also with stride 2 where the algorithm supports it (FFT and Winograd
    only do stride 1, and say so).
    """),
    code("""
    rng = np.random.default_rng(0)
    x64 = rng.standard_normal((4, 3, 12, 12))
    w64 = rng.standard_normal((5, 3, 3, 3))
    for stride in (1, 2):
        desc = B.ConvolutionDescriptor(padding=1, stride=stride)
        dy = rng.standard_normal(B.get_convolution_forward_output_dim(desc, x64.shape, w64.shape))
        for name, (fwd, data, filt) in ALGORITHMS.items():
            try:
                y_dot_dy = np.vdot(B.convolution_forward(None, x64, w64, desc, algo=fwd), dy)
                x_dot_dx = np.vdot(x64, B.convolution_backward_data(None, w64, dy, desc, x64.shape, algo=data))
                w_dot_dw = np.vdot(w64, B.convolution_backward_filter(None, x64, dy, desc, w64.shape, algo=filt))
            except B.NotSupportedError as e:         # the message ends with the rule that failed
                print(f"stride {stride} {name:18s} not supported: {str(e).rsplit(': ', 1)[-1]}")
                continue
            gap = max(abs(y_dot_dy - x_dot_dx), abs(y_dot_dy - w_dot_dw)) / abs(y_dot_dy)
            print(f"stride {stride} {name:18s} <y,dy> = {y_dot_dy:+.10f}   relative gap {gap:.1e}")
            assert gap < 1e-10
    """),
    md("""
    ## Which one is fastest? Ask `find`

    No algorithm wins everywhere: GEMM pays for the im2col copy, DIRECT for many small products, FFT
    pays a fixed transform cost that a larger kernel amortises, Winograd saves multiplies only on 3x3.
    `find_convolution_forward_algorithm` runs every algorithm on the actual arrays and returns them
    sorted by measured time (cuDNN's `cudnnFindConvolutionForwardAlgorithm`). Timings below are from
    this machine's CPU, so your bars will differ.
    """),
    code("""
    problems = {
        "digits 64x1x32x32, 4 filters 3x3": (x, w, B.ConvolutionDescriptor(padding=1)),
        "16x16x16x16, 32 filters 3x3": (rng.standard_normal((16, 16, 16, 16)).astype(np.float32),
                                         rng.standard_normal((32, 16, 3, 3)).astype(np.float32),
                                         B.ConvolutionDescriptor(padding=1)),
        "8x8x24x24, 16 filters 7x7": (rng.standard_normal((8, 8, 24, 24)).astype(np.float32),
                                      rng.standard_normal((16, 8, 7, 7)).astype(np.float32),
                                      B.ConvolutionDescriptor(padding=3)),
    }
    timings = {}
    for label, (xi, wi, di) in problems.items():
        results = B.find_convolution_forward_algorithm(None, xi, wi, di, repeats=3)
        timings[label] = {r.algo.name: r.time for r in results if r.time >= 0}
        heuristic = B.get_convolution_forward_algorithm_v7(None, xi.shape, wi.shape, di)[0].algo.name
        print(f"{label:36s} fastest: {results[0].algo.name:18s} heuristic's guess: {heuristic}")

    names = list(ALGORITHMS)
    fig, ax = plt.subplots(figsize=(9, 3.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        values = [timings[p].get(name, np.nan) for p in problems]
        ax.bar(np.arange(len(problems)) + i * width, values, width, label=name)
    ax.set_xticks(np.arange(len(problems)) + 0.4 - width / 2, list(problems), fontsize=8)
    ax.set_ylabel("ms (median of 3)"); ax.set_yscale("log"); ax.legend(fontsize=8)
    ax.set_title("find_convolution_forward_algorithm on this CPU (missing bar: not supported)")
    plt.show()
    """),
    md("""
    **Summary.** One formula, four algorithms with different costs; backward data and backward filter are
    the two adjoints of the forward, which gives a test that needs no reference; and the choice is made by
    measuring (`find`) or by a cost model (`get_..._algorithm`), never by `if` chains inside the op.
    `docs/backend_convolution.md` has the support matrix and the workspace each algorithm needs.
    """),
]

# ---------------------------------------------------------------------------------------------------------
NOTEBOOKS["03_training_a_cnn"] = [
    md("""
    # 3. Training a CNN on handwritten digits

    From data to a trained LeNet-5 and a look at what it learned, in the plain training loop every
    PyTorch user knows: forward, loss, `zero_grad`, `backward`, `step`.

    The data are the 1,797 8x8 digits bundled with minidnn (UCI's optdigits, as in scikit-learn) (1,437 for training,
    360 for testing). LeNet's two 5x5
    convolutions and 2x2 poolings need more room than 8x8, so the images are upsampled to 16x16 and shifted
    by up to one pixel at random while training (a cheap augmentation).
    """),
    code("""
    import time
    import numpy as np
    import matplotlib.pyplot as plt
    import minidnn as mdn
    from minidnn import nn, optim
    from minidnn.nn import functional as F
    from minidnn.data import DataLoader
    from minidnn.data import transforms as T
    from minidnn.data.datasets import load_digits
    from minidnn.models import LeNet5

    mdn.manual_seed(0)
    %matplotlib inline
    """),
    md("""
    ## Data

    Transforms work on whole batches `(N, C, H, W)`; the loader applies them after fetching each batch.
    """),
    code("""
    train_set, test_set = load_digits("train"), load_digits("test")
    normalize = T.Normalize([0.3055], [0.3761])         # mean and std of the training pixels
    train_tf = T.Compose([T.Upsample(2), T.RandomCrop(16, padding=1), normalize])
    test_tf = T.Compose([T.Upsample(2), normalize])
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True, transform=train_tf)
    test_loader = DataLoader(test_set, batch_size=360, transform=test_tf)

    images, labels = next(iter(DataLoader(train_set, batch_size=10)))
    fig, axes = plt.subplots(1, 10, figsize=(10, 1.3))
    for ax, img, label in zip(axes, images.numpy(), labels.numpy()):
        ax.imshow(img[0], cmap="gray_r"); ax.set_title(int(label)); ax.axis("off")
    plt.show()
    """),
    md("""
    ## Model

    `minidnn.summary` runs one forward pass with hooks and tabulates each layer's output shape, parameters
    and multiply-adds.
    """),
    code("""
    model = LeNet5(num_classes=10, in_channels=1, input_size=16)
    print(mdn.summary(model, input_shape=(1, 1, 16, 16), verbose=0))
    """),
    md("""
    ## Training

    Adam with a learning rate that decays along a cosine over the run. `model.train()` / `model.eval()`
    matter for layers like dropout and batch norm (LeNet has neither, but the habit is free), and
    `mdn.no_grad()` skips recording a graph during evaluation.
    """),
    code("""
    def evaluate(model, loader):
        model.eval()
        predictions, targets, loss_sum = [], [], 0.0
        with mdn.no_grad():
            for x, y in loader:
                logits = model(x)
                loss_sum += F.cross_entropy(logits, y).item() * len(y)
                predictions.append(logits.argmax(dim=1).numpy()); targets.append(y.numpy())
        predictions, targets = np.concatenate(predictions), np.concatenate(targets)
        return loss_sum / len(targets), float((predictions == targets).mean()), predictions, targets

    epochs = 8
    optimizer = optim.Adam(model.parameters(), lr=3e-3)
    scheduler = optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(train_loader))
    history = {"train_loss": [], "test_loss": [], "test_acc": []}
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        losses = []
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
        test_loss, test_acc, _, _ = evaluate(model, test_loader)
        history["train_loss"].append(np.mean(losses))
        history["test_loss"].append(test_loss)
        history["test_acc"].append(test_acc)
        print(f"epoch {epoch + 1}: train loss {np.mean(losses):.3f}  test loss {test_loss:.3f}  "
              f"test accuracy {test_acc:.3f}")
    print(f"{time.perf_counter() - start:.1f} s")
    """),
    code("""
    from matplotlib.ticker import MaxNLocator
    epochs = np.arange(1, len(history["test_acc"]) + 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
    ax1.plot(epochs, history["train_loss"], "o-", color="C0", label="train")
    ax1.plot(epochs, history["test_loss"], "s--", color="C3", markerfacecolor="none", label="test")
    ax1.set(title="cross-entropy loss", xlabel="epoch"); ax1.legend()
    ax2.plot(epochs, history["test_acc"], "s--", color="C3", markerfacecolor="none")
    ax2.set(title="test accuracy", xlabel="epoch")
    for ax in (ax1, ax2): ax.grid(alpha=0.3); ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    plt.show()
    """),
    md("""
    ## Where does it go wrong? The confusion matrix

    Row = true digit, column = predicted digit; the diagonal holds the correct answers. Off-diagonal cells
    show which digits the model confuses.
    """),
    code("""
    _, accuracy, predicted, true = evaluate(model, test_loader)
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (true, predicted), 1)

    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.imshow(confusion, cmap="Blues")
    for i in range(10):
        for j in range(10):
            if confusion[i, j]:
                ax.text(j, i, confusion[i, j], ha="center", va="center",
                        color="white" if i == j else "black", fontsize=8)
    ax.set(xlabel="predicted", ylabel="true", xticks=range(10), yticks=range(10),
           title=f"test accuracy {accuracy:.3f}")
    plt.show()
    """),
    code("""
    wrong = np.flatnonzero(predicted != true)
    print(len(wrong), "misclassified test images")
    if len(wrong):
        fig, axes = plt.subplots(1, len(wrong[:10]), figsize=(1.2 * len(wrong[:10]), 1.6), squeeze=False)
        for ax, i in zip(axes[0], wrong[:10]):
            ax.imshow(test_set[int(i)][0][0], cmap="gray_r")
            ax.set_title(f"{true[i]} -> {predicted[i]}", fontsize=9); ax.axis("off")
        plt.show()
    """),
    md("""
    ## What did the first layer learn?

    The six 5x5 filters of the first convolution, and what each one makes of a test digit: edge and stroke
    detectors at different orientations, found by gradient descent alone.
    """),
    code("""
    conv1 = model.features[0]
    filters = conv1.weight.detach().numpy()[:, 0]            # (6, 5, 5)
    digit = test_tf(test_set[0][0][None])                    # (1, 1, 16, 16)
    with mdn.no_grad():
        maps = conv1(mdn.tensor(digit)).numpy()[0]           # (6, 16, 16)

    fig, axes = plt.subplots(2, 7, figsize=(10, 3))
    axes[0, 0].imshow(digit[0, 0], cmap="gray_r"); axes[0, 0].set_title("input")
    axes[1, 0].axis("off")
    scale = np.abs(filters).max()                            # one colour scale, white = 0
    for k in range(6):
        axes[0, k + 1].imshow(filters[k], cmap="RdBu_r", vmin=-scale, vmax=scale)
        axes[0, k + 1].set_title(f"filter {k}")
        axes[1, k + 1].imshow(maps[k], cmap="viridis")
    for ax in axes.flat: ax.set_xticks([]); ax.set_yticks([])
    plt.show()
    """),
    md("""
    ## Save, load, predict

    `minidnn.save` writes a zip of `.npy` arrays and JSON (no pickle: loading a file can never run code).
    A fresh model loaded from it predicts exactly what the trained one does.
    """),
    code("""
    import os, tempfile
    path = os.path.join(tempfile.mkdtemp(), "lenet_digits.mdn")
    mdn.save(model.state_dict(), path)
    print(f"{os.path.getsize(path) / 1024:.0f} KiB")

    restored = LeNet5(num_classes=10, in_channels=1, input_size=16)
    restored.load_state_dict(mdn.load(path))
    print("same predictions:", np.array_equal(evaluate(restored, test_loader)[2], predicted))
    """),
    md("""
    **Summary.** The same loop trains anything: `examples/train_lenet.py` adds a one-cycle schedule,
    checkpoints and resuming, and reaches about 99% on these digits in under 20 seconds.
    """),
]

# ---------------------------------------------------------------------------------------------------------
NOTEBOOKS["04_fused_optimizers"] = [
    md("""
    # 4. Fused optimizers and flat buffers

    An optimizer step is elementwise arithmetic over every parameter: for Adam, about ten array operations
    per parameter tensor. A model with 100 parameter tensors pays ~1,000 small operations per step. On a
    GPU each is a kernel launch (microseconds each, however small the tensor); on a CPU each is a trip
    through the Python interpreter and NumPy's dispatch.

    The fix (NVIDIA apex, PyTorch's `fused=True`): keep **all** parameters in one contiguous array, make
    each parameter a *view* into it, and run the update once over the whole array. minidnn's `SGD`, `Adam`
    and `AdamW` do this by default. This notebook shows the layout and checks that the fused and the
    per-tensor loop compute the same thing.
    """),
    code("""
    import time
    import numpy as np
    import matplotlib.pyplot as plt
    import minidnn as mdn
    from minidnn import nn, optim
    from minidnn.nn import functional as F
    from minidnn.data import DataLoader
    from minidnn.data import transforms as T
    from minidnn.data.datasets import load_digits
    from minidnn.models import LeNet5

    mdn.manual_seed(0)
    %matplotlib inline
    """),
    md("""
    ## Parameters become views into one buffer

    Building the optimizer moves each parameter's values into the flat buffer and rebinds `p.data` to its
    slice. We can see this with NumPy alone: every `p.data.base` (the array that owns the memory) is the
    same object, and the byte offsets are consecutive, each rounded up to 128 bytes so every slice starts on
    a vector boundary.
    """),
    code("""
    model = LeNet5(input_size=16)
    optimizer = optim.Adam(model.parameters(), lr=1e-3)         # fused by default
    params = dict(model.named_parameters())
    flat = next(iter(params.values())).data.base
    print(f"flat parameter buffer: {flat.shape[0]:,} float32 elements, "
          f"{sum(p.numel() for p in params.values()):,} of them parameters (the rest is alignment padding)")
    print(f"{'parameter':24s}{'shape':>16s}{'offset':>10s}{'numel':>8s}   view of the buffer?")
    for name, p in params.items():
        offset = (p.data.__array_interface__["data"][0] - flat.__array_interface__["data"][0]) // 4
        print(f"{name:24s}{str(tuple(p.shape)):>16s}{offset:>10d}{p.numel():>8d}   {p.data.base is flat}")
    """),
    md("""
    ## Gradients land in a flat buffer too

    The optimizer also gives each parameter a slice of a flat *gradient* buffer, and backward writes the
    first gradient of each parameter straight into it. So after `backward()` the whole gradient is one
    array, without a single copy, ready for the fused update (or for one all-reduce in data-parallel
    training).
    """),
    code("""
    train_set = load_digits("train")
    loader = DataLoader(train_set, batch_size=32, shuffle=True, seed=0,
                        transform=T.Compose([T.Upsample(2), T.Normalize([0.3055], [0.3761])]))
    x, y = next(iter(loader))
    optimizer.zero_grad()
    F.cross_entropy(model(x), y).backward()

    flat_grad = next(iter(params.values())).grad.data.base
    print("every .grad is a view of one buffer:", all(p.grad.data.base is flat_grad for p in params.values()))
    print("it is not the parameter buffer:", flat_grad is not flat)
    print("sum of squares, flat vs per tensor:", float((flat_grad ** 2).sum()),
          sum(float((p.grad.numpy() ** 2).sum()) for p in params.values()))
    """),
    md("""
    ## One update instead of one per tensor

    The optimizer counts the vectorised passes (kernel launches on a GPU) of its last step in
    `_launches_per_step` (an internal counter, shown here for teaching). With every parameter float32 on
    one device there is one flat set, hence **one** pass, whatever the number of tensors. The per-tensor
    loop (`fused=False`) instead runs its handful of array operations once per parameter tensor.
    """),
    code("""
    optimizer.step()
    print("fused Adam, LeNet-5:", optimizer._launches_per_step, "vectorised update for",
          len(params), "parameter tensors")
    """),
    md("""
    ## Same numbers either way

    Two copies of the same model, one trained with the fused step and one with the per-tensor loop, for 30
    steps on the same digit batches. The test suite requires agreement to float32 rounding; on the CPU
    minidnn's two paths even perform the same operations in the same order, so the weights stay bitwise
    identical (a GPU kernel may round differently, within tolerance).
    """),
    code("""
    def make(fused, kind):
        mdn.manual_seed(1)
        m = LeNet5(input_size=16)
        opt = {"SGD": lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4, fused=fused),
               "Adam": lambda ps: optim.Adam(ps, lr=1e-3, fused=fused),
               "AdamW": lambda ps: optim.AdamW(ps, lr=1e-3, weight_decay=0.05, fused=fused)}[kind]
        return m, opt(m.parameters())

    batches = [batch for _, batch in zip(range(30), loader)]             # the first 30 batches
    fig, axes = plt.subplots(1, 3, figsize=(10, 3), sharey=True)          # one panel each: Adam and AdamW overlap
    for i, (ax, kind) in enumerate(zip(axes, ("SGD", "Adam", "AdamW"))):
        runs = {"fused": make(True, kind), "loop": make(False, kind)}
        losses = {path: [] for path in runs}
        for x, y in batches:
            for path, (m, o) in runs.items():
                loss = F.cross_entropy(m(x), y)
                o.zero_grad(); loss.backward(); o.step()
                losses[path].append(loss.item())
        gap = max(float(np.abs(a.numpy() - b.numpy()).max())
                  for a, b in zip(runs["fused"][0].parameters(), runs["loop"][0].parameters()))
        print(f"{kind:6s} max |weight difference| after 30 steps: {gap:.1e}")
        steps = np.arange(1, len(batches) + 1)
        ax.plot(steps, losses["fused"], "-", color=f"C{i}", label="fused")
        ax.plot(steps, losses["loop"], "o", color="black", markersize=3, label="loop")
        ax.set(xlabel="step", title=kind); ax.legend(fontsize=8); ax.grid(alpha=0.3)
    axes[0].set_ylabel("training loss")
    fig.suptitle("fused (line) and loop (dots) trace the same path")
    fig.tight_layout(); plt.show()
    """),
    md("""
    ## When does fusing pay?

    The win grows with the number of parameter tensors and shrinks with their size: with a few big tensors
    the loop's overhead is negligible next to the arithmetic. A stack of 40 small linear layers (80 tensors)
    against LeNet-5 (10 tensors), time per `step()` on this CPU:
    """),
    code("""
    def step_time(model, kind, fused, repeats=30):
        opt = {"SGD": lambda ps: optim.SGD(ps, lr=0.01, momentum=0.9, fused=fused),
               "Adam": lambda ps: optim.Adam(ps, lr=1e-3, fused=fused)}[kind](model.parameters())
        for p in model.parameters():
            p.grad = mdn.randn(*p.shape)
        opt.step()                                           # warm-up (allocates the state)
        start = time.perf_counter()
        for _ in range(repeats):
            opt.step()
        return (time.perf_counter() - start) / repeats * 1e3

    models = {"LeNet-5 (10 tensors)": lambda: LeNet5(input_size=16),
              "40 x Linear(32, 32) (80 tensors)": lambda: nn.Sequential(*[nn.Linear(32, 32) for _ in range(40)])}
    print(f"{'model':34s}{'optimizer':>10s}{'loop ms':>10s}{'fused ms':>10s}{'speed-up':>10s}")
    for label, build in models.items():
        for kind in ("SGD", "Adam"):
            loop, fused = step_time(build(), kind, False), step_time(build(), kind, True)
            print(f"{label:34s}{kind:>10s}{loop:>10.3f}{fused:>10.3f}{loop / fused:>9.1f}x")
    """),
    md("""
    **Summary.** Flat buffers turn N small updates into one big one; parameters and gradients stay
    ordinary tensors to the user because they are views. On a GPU the same step is a single CUDA kernel
    launch per flat set (`minidnn/backend/cuda/multi_tensor.py`), which is where the speed-up is largest.
    """),
]

# ---------------------------------------------------------------------------------------------------------
NOTEBOOKS["05_grouped_convolutions"] = [
    md("""
    # 5. Grouped and depthwise convolutions

    An ordinary convolution connects every output channel to every input channel. A **grouped**
    convolution (`groups=G`) splits the C input and K output channels into G groups and convolves each
    group separately: G independent convolutions, each 1/G as wide, so 1/G of the parameters and
    multiply-adds. AlexNet used G = 2 to fit on two GPUs; ResNeXt uses it for accuracy.

    The extreme, `groups = C`, is a **depthwise** convolution: one filter per channel, no mixing between
    channels at all. MobileNet pairs it with a 1x1 **pointwise** convolution (channel mixing only). The
    pair, a *depthwise-separable* convolution, costs a fraction of a full 3x3 convolution.
    """),
    code("""
    import time
    import numpy as np
    import matplotlib.pyplot as plt
    import minidnn as mdn
    from minidnn import nn
    from minidnn.nn import functional as F
    from minidnn.data.datasets import load_digits
    from minidnn.data import transforms as T
    from minidnn.models import DepthwiseSeparable, MobileNetSmall

    mdn.manual_seed(0)
    %matplotlib inline
    """),
    md("""
    ## Parameters and multiply-adds

    A 3x3 convolution from 64 to 64 channels on a 16x16 map, for several group counts, and the
    depthwise-separable block. `minidnn.summary` measures both numbers from one forward pass. The weight of
    a grouped convolution has shape `(K, C/G, 3, 3)`: each output channel only sees its group's C/G inputs.
    """),
    code("""
    C = K = 64
    layers = {f"groups={g}": nn.Conv2d(C, K, 3, padding=1, groups=g, bias=False) for g in (1, 2, 4, 16, 64)}
    layers["depthwise + pointwise"] = DepthwiseSeparable(C, K)
    rows = []
    for name, layer in layers.items():
        s = mdn.summary(layer, input_shape=(1, C, 16, 16), verbose=0)
        rows.append((name, s.total_params, s.total_mult_adds))
    full_params, full_macs = rows[0][1], rows[0][2]
    print(f"{'layer':24s}{'weight shape':>18s}{'params':>10s}{'mult-adds':>12s}{'vs full':>9s}")
    for (name, params, macs), layer in zip(rows, layers.values()):
        shape = str(tuple(layer.weight.shape)) if hasattr(layer, "weight") else "(see below)"
        print(f"{name:24s}{shape:>18s}{params:>10,}{macs:>12,}{macs / full_macs:>9.3f}")
    """),
    md("""
    The depthwise-separable block's cost relative to the full convolution is `1/K + 1/9` in theory (the 1x1
    mixing plus one 3x3 filter per channel); the table's figure is a little above that because it also
    counts the block's two batch norms. Its parameters:
    """),
    code("""
    print(mdn.summary(DepthwiseSeparable(C, K), input_shape=(1, C, 16, 16), verbose=0))
    """),
    code("""
    fig, ax = plt.subplots(figsize=(8, 3.2))
    labels = [r[0].replace(" + ", "\\n+ ") for r in rows]                   # two lines: no overlapping labels
    ax.bar(labels, [r[2] for r in rows], color=["C0"] * 5 + ["C2"])
    ax.set_yscale("log"); ax.set_ylabel("mult-adds (log)"); ax.tick_params(axis="x", labelsize=9)
    ax.set_title("3x3 convolution 64 -> 64 channels on 16x16")
    plt.show()
    """),
    md("""
    ## A grouped convolution is G ordinary ones

    Let us check the definition numerically on real data. A first convolution turns a batch of digits into
    8 feature maps; a grouped convolution with G = 4 on them must equal four ordinary convolutions, each
    on its group's 2 input channels with its group's slice of the filters, concatenated. Gradients must
    agree as well. In float64, so that the only differences left are rounding (about 1e-16 relative).
    """),
    code("""
    digits = T.Upsample(2)(load_digits("test").data[:16])            # (16, 1, 16, 16)
    features = F.relu(nn.Conv2d(1, 8, 3, padding=1)(mdn.tensor(digits))).detach()   # (16, 8, 16, 16)

    def grouped_by_loop(x, weight, groups):
        c, k = x.shape[1] // groups, weight.shape[0] // groups
        return mdn.cat([F.conv2d(x[:, g * c:(g + 1) * c], weight[g * k:(g + 1) * k], padding=1)
                        for g in range(groups)], dim=1)

    def relative_difference(a, b):
        return float((a - b).abs().max() / b.abs().max())

    for groups, out_channels in ((4, 8), (8, 8), (8, 16)):       # grouped; depthwise; depthwise x2 multiplier
        x = features.double().requires_grad_()
        weight = mdn.randn(out_channels, 8 // groups, 3, 3, dtype=mdn.float64, requires_grad=True)
        one_op = F.conv2d(x, weight, padding=1, groups=groups)
        looped = grouped_by_loop(x, weight, groups)
        grads_one_op = mdn.autograd.grad((one_op * one_op).sum(), (x, weight))
        grads_looped = mdn.autograd.grad((looped * looped).sum(), (x, weight))
        print(f"groups={groups}, K={out_channels:2d}:  relative difference  y {relative_difference(one_op, looped):.1e}"
              f"   dx {relative_difference(grads_one_op[0], grads_looped[0]):.1e}"
              f"   dw {relative_difference(grads_one_op[1], grads_looped[1]):.1e}")
    """),
    md("""
    ## Fewer multiply-adds is not the same as faster

    Savings in arithmetic only turn into time when the arithmetic was the bottleneck. The full convolution
    is one large matrix product, which BLAS runs close to the processor's peak. G groups are G smaller
    products, each with less work to hide its overhead; a depthwise convolution does only 9 multiply-adds
    per value it reads, far too few to keep a CPU's (or GPU's) arithmetic units busy: it is limited by
    memory traffic. Timing forward passes on this CPU (look at the GMAC/s column: how well the arithmetic
    units are used):
    """),
    code("""
    x = mdn.randn(32, C, 16, 16)
    print(f"{'layer':24s}{'ms':>8s}{'GMAC/s':>8s}")
    with mdn.no_grad():
        for (name, _, macs), layer in zip(rows, layers.values()):
            layer.eval()
            layer(x)                                                 # warm-up
            start = time.perf_counter()
            for _ in range(5):
                layer(x)
            ms = (time.perf_counter() - start) / 5 * 1e3
            print(f"{name:24s}{ms:>8.2f}{32 * macs / ms / 1e6:>8.2f}")
    """),
    md("""
    ## A whole network

    `MobileNetSmall` (used by `examples/train_mobilenet.py`) stacks four depthwise-separable blocks. On a
    32x32 RGB image it has a few tens of thousands of parameters, a fraction of ResNet-20's 0.27 M.
    """),
    code("""
    net = MobileNetSmall(num_classes=10, in_channels=3, width=16)
    for name, model in (("MobileNetSmall", net), ("ResNet-20", mdn.models.resnet20())):
        s = mdn.summary(model, input_shape=(1, 3, 32, 32), verbose=0)
        print(f"{name:15s}{s.total_params:>9,} parameters {s.total_mult_adds / 1e6:6.1f} M mult-adds per image")
    """),
    md("""
    **Summary.** `groups` divides parameters and multiply-adds by G; depthwise + pointwise replaces a 3x3
    convolution at roughly `1/9 + 1/K` of its cost; a grouped convolution is exactly G smaller ones, which
    is also how to test it; and the arithmetic saved only becomes time saved when memory keeps up.
    """),
]


# ---------------------------------------------------------------------------------------------------------
def build(cells):
    """An nbformat v4 notebook with no outputs, execution counts None and deterministic cell ids."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for i, (kind, text) in enumerate(cells):
        source = textwrap.dedent(text).strip("\n")
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.id = f"cell-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(cells):
    return nbformat.writes(build(cells)) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    stale = []
    for name, cells in NOTEBOOKS.items():
        path = HERE / f"{name}.ipynb"
        text = render(cells)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print("wrote", path.relative_to(HERE.parent))
    if stale:
        print("out of date (run python notebooks/_build.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
