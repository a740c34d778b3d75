"""Which parameters' gradients the engine still copies into the optimizer's flat buffer, step by step (gradient
destinations, minidnn/_grad_dest.py), for a model on a device: ResNet-20 by default.

    PYTHONPATH=. python3 tools/grad_dest_probe.py [--model resnet20] [--batch 16] [--steps 3] [--device cuda] [--cl]
"""
import argparse

import minidnn as mdn
import minidnn.autograd as A
import minidnn.models as M
import minidnn.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet20")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cl", action="store_true")
    args = ap.parse_args()
    mdn.manual_seed(0)
    model = (M.resnet20(num_classes=10) if args.model == "resnet20" else
             M.MobileNetSmall(num_classes=10, in_channels=3)).to(args.device)
    x = mdn.randn(args.batch, 3, 32, 32, device=args.device)
    if args.cl:
        model.to(memory_format=mdn.channels_last)
        x = x.to(memory_format=mdn.channels_last)
    y = mdn.randint(0, 10, (args.batch,), device=args.device)
    opt = mdn.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    names = {}
    copied, sums = [], [0]
    real_copy, real_add = A._copy_into, A._add_grads

    def copy_into(dst, src):
        copied.append(names.get(id(dst), f"? {tuple(dst.shape)}"))
        return real_copy(dst, src)

    def add_grads(a, b, create_graph):
        sums[0] += a is not None
        return real_add(a, b, create_graph)
    A._copy_into, A._add_grads = copy_into, add_grads
    for step in range(args.steps):
        copied.clear()
        sums[0] = 0
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        for n, p in model.named_parameters():
            if p._grad_storage is not None:
                names[id(p._grad_storage)] = n
        print(f"step {step}: {len(copied)} leaf copies, {sums[0]} gradient sums: {sorted(copied)}")


if __name__ == "__main__":
    main()
