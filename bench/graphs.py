"""Training step eager vs CUDA-graphed, minidnn beside PyTorch (torch.cuda.graph), from one run.

For LeNet-5 b64, ResNet-20 b128 and MobileNet-small b128 (both frameworks built from minidnn/models.py, see
bench/train_step.py), SGD momentum 0.9 and Adam: median ms of one step (forward, cross-entropy, zero_grad,
backward, optimizer step) run eagerly and replayed from a graph captured with PyTorch's pattern, and minidnn.compile.

    python bench/graphs.py [--steps 50] [--models lenet5,resnet20,mobilenet] [--tf32]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from train_step import CONFIGS, _median_ms, torch, torch_models  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402


def _capture(lib, step):
    s = lib.cuda.Stream()
    s.wait_stream(lib.cuda.current_stream())
    with lib.cuda.stream(s):
        for _ in range(3):
            step()
    lib.cuda.current_stream().wait_stream(s)
    g = lib.cuda.CUDAGraph()
    with lib.cuda.graph(g):
        step()
    return g.replay


def minidnn_steps(name, opt_name):
    ctor, shape, batch = CONFIGS[name]
    mdn.manual_seed(0)
    model = eval(ctor, vars(minidnn.models)).to("cuda")
    opt = (mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt_name == "sgd"
           else mdn.optim.Adam(model.parameters(), lr=1e-3))
    x = mdn.randn(batch, *shape, device="cuda")
    y = mdn.randint(0, 10, (batch,), device="cuda")

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    compiled = mdn.compile(lambda a, b: step())
    return step, _capture(mdn, step), lambda: compiled(x, y)


def torch_steps(name, opt_name, ns):
    ctor, shape, batch = CONFIGS[name]
    torch.manual_seed(0)
    model = eval(ctor, ns).to("cuda")
    opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if opt_name == "sgd"
           else torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True))
    x = torch.randn(batch, *shape, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        return loss
    return step, _capture(torch, step)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--models", default="lenet5,resnet20,mobilenet")
    ap.add_argument("--opts", default="sgd,adam")
    ap.add_argument("--tf32", action="store_true", help="TF32 on both sides (minidnn: MathType.TENSOR_OP)")
    args = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    # the same math on both sides: PyTorch's cuDNN convolutions default to TF32, so strict fp32 must be asked for
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    mdn.backends.cudnn.allow_tf32 = args.tf32
    ns = torch_models()
    msync, tsync = mdn.cuda.synchronize, torch.cuda.synchronize
    print(f"{'model':<10} {'opt':<5} {'mdn eager':>10} {'mdn graph':>10} {'mdn compile':>12} {'torch eager':>12} "
          f"{'torch graph':>12} {'graph ratio':>12}")
    for name in args.models.split(","):
        for opt_name in args.opts.split(","):
            m_eager, m_graph, m_compiled = minidnn_steps(name, opt_name)
            t_eager, t_graph = torch_steps(name, opt_name, ns)
            me, mg, mc = (_median_ms(f, msync, args.steps) for f in (m_eager, m_graph, m_compiled))
            te, tg = (_median_ms(f, tsync, args.steps) for f in (t_eager, t_graph))
            print(f"{name:<10} {opt_name:<5} {me:>10.3f} {mg:>10.3f} {mc:>12.3f} {te:>12.3f} {tg:>12.3f} "
                  f"{mg / tg:>11.2f}x", flush=True)


if __name__ == "__main__":
    main()
