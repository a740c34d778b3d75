"""Mixed-precision training steps, minidnn beside PyTorch (torch.autocast), from one run.

Models: ResNet-20 and MobileNet-small at batch 128 on CIFAR-sized input, both frameworks built from the same
source (minidnn/models.py; see bench/train_step.py's torch_models).  One step = forward under autocast,
cross-entropy, backward, SGD(momentum 0.9) step; float16 adds GradScaler (scale, step, update).
Rows: fp32, bf16 (autocast), fp16 (autocast + GradScaler), and fp32+cl / bf16+cl (model and input channels_last);
median ms per step eager, and minidnn's time as a fraction of its own fp32 step in the same layout (issue target for
bf16: <= 0.75; a +cl row is divided by fp32+cl); on a GPU also the step captured and replayed from a CUDA graph on
both sides, with the graphed step's fraction of its own graphed fp32 step.

    python bench/amp_step.py [--device cuda] [--steps 30] [--models resnet20,mobilenet] [--modes fp32,bf16]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from graphs import _capture  # noqa: E402
from train_step import CONFIGS, PIPELINED, paired_medians, torch, torch_models  # noqa: E402

import minidnn as mdn  # noqa: E402
import minidnn.models  # noqa: E402
import minidnn.nn.functional as F  # noqa: E402

MODES = ("fp32", "bf16", "fp16", "fp32+cl", "bf16+cl")     # +cl: model and input in channels_last


def minidnn_step(name, mode, device):
    ctor, shape, batch = CONFIGS[name]
    mdn.manual_seed(0)
    cl = mode.endswith("+cl")
    mode = mode.split("+")[0]
    model = eval(ctor, vars(minidnn.models)).to(device)
    if cl:
        model.to(memory_format=mdn.channels_last)
    opt = mdn.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = mdn.amp.GradScaler(device, enabled=mode == "fp16")
    x = mdn.randn(batch, *shape, device=device)
    x = x.to(memory_format=mdn.channels_last) if cl else x
    y = mdn.randint(0, 10, (batch,), device=device)
    dtype = {"bf16": mdn.bfloat16, "fp16": mdn.float16}.get(mode, mdn.bfloat16)

    def step():
        with mdn.autocast(device, dtype=dtype, enabled=mode != "fp32"):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def torch_step(name, mode, device, ns):
    ctor, shape, batch = CONFIGS[name]
    torch.manual_seed(0)
    cl = mode.endswith("+cl")
    mode = mode.split("+")[0]
    model = eval(ctor, ns).to(device)
    if cl:
        model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=mode == "fp16")
    x = torch.randn(batch, *shape, device=device)
    x = x.to(memory_format=torch.channels_last) if cl else x
    y = torch.randint(0, 10, (batch,), device=device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, torch.bfloat16)

    def step():
        with torch.autocast(device, dtype=dtype, enabled=mode != "fp32"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if mdn.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--models", default="resnet20,mobilenet")
    ap.add_argument("--modes", default=",".join(MODES), help="rows, from " + ",".join(MODES)
                    + " (a row's fp32 of the same layout is timed with it)")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graphed columns")
    ap.add_argument("--pipelined", type=int, default=0, metavar="K",
                    help="eager: time turns of K steps with one synchronisation each (default 0: one a step)")
    args = ap.parse_args()
    asked = args.modes.split(",")
    bad = [m for m in asked if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown {bad}; known: {', '.join(MODES)}")
    # each row is judged against the fp32 step of its own layout, so that one is timed too
    cl = any(a.endswith("+cl") for a in asked)
    asked = [m for m in MODES if m in asked or m == "fp32" or (m == "fp32+cl" and cl)]
    PIPELINED[0] = args.pipelined
    if args.device == "cpu":
        print("note: on the CPU only bf16 autocast exists (fp16 is skipped); CPU times are not the target")
    if torch is not None and args.device == "cuda":
        torch.backends.cudnn.benchmark = True
        # the fp32 rows in the same math on both sides: PyTorch's cuDNN convolutions default to TF32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ns = torch_models() if torch is not None else None
    tsync = (torch.cuda.synchronize if args.device == "cuda" else (lambda: None)) if torch is not None else None
    graphed = args.device == "cuda" and not args.no_graphs
    print(f"{'model':<10} {'mode':<8} {'minidnn ms':>11} {'PyTorch ms':>11} {'ratio':>7} {'vs own fp32':>12}"
          + (f" {'mdn graphed':>12} {'torch graphed':>14} {'ratio':>7} {'vs own fp32':>12}" if graphed else ""))
    for name in args.models.split(","):
        modes = [m for m in asked if not (m.startswith("fp16") and args.device == "cpu")]
        # every eager step of the model, both frameworks, timed in alternation (train_step.paired_medians): the
        # "vs own fp32" and "ratio" columns compare steps that saw the same host
        m_steps = [minidnn_step(name, mode, args.device) for mode in modes]
        t_steps = [torch_step(name, mode, args.device, ns) for mode in modes] if ns else []
        msync = lambda: mdn.cuda.synchronize()     # noqa: E731
        runs = [(s, msync) for s in m_steps] + [(s, tsync) for s in t_steps]
        medians = paired_medians(runs, args.steps)
        m_all, t_all = medians[:len(modes)], medians[len(modes):] or [float("nan")] * len(modes)
        own = {m: ms for m, ms in zip(modes, m_all) if m.startswith("fp32")}
        own_graphed = {}
        for mode, m_step, m_ms, t_ms, t_step in zip(modes, m_steps, m_all, t_all, t_steps or [None] * len(modes)):
            fp32_of = "fp32+cl" if mode.endswith("+cl") else "fp32"
            line = (f"{name:<10} {mode:<8} {m_ms:>11.2f} {t_ms:>11.2f} {m_ms / t_ms:>6.2f}x "
                    f"{m_ms / own[fp32_of]:>11.2f}x")
            if graphed:
                try:
                    m_graph = _capture(mdn, m_step)
                except Exception as exc:        # report, keep the table going
                    m_graph = None
                    print(f"  minidnn capture failed: {type(exc).__name__}: {str(exc)[:200]}")
                # torch's GradScaler.step reads found_inf with .item(): a fp16 step cannot be captured there
                torch_capturable = ns is not None and not mode.startswith("fp16")
                t_graph = _capture(torch, t_step) if torch_capturable else None
                runs = [(g, sync) for g, sync in ((m_graph, msync), (t_graph, tsync)) if g is not None]
                got = iter(paired_medians(runs, args.steps, pipelined=0))     # (replays: per-step sync as ever)
                mg = next(got) if m_graph is not None else float("nan")
                tg = next(got) if t_graph is not None else float("nan")
                if mode == fp32_of:
                    own_graphed[mode] = mg
                line += (f" {mg:>12.2f} {tg:>14.2f} {mg / tg:>6.2f}x"
                         f" {mg / own_graphed.get(fp32_of, float('nan')):>11.2f}x")
            print(line, flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
