"""The launcher: ``python -m minidnn.distributed.run --nproc-per-node N script.py [args...]`` (torchrun's shape).

Starts N copies of the script (or ``-m module``) with PyTorch's environment variables RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (plus MINIDNN_DIST_AUTHKEY, a random key the rendezvous
authenticates with), then watches them: when one exits with an error, the others are terminated and the
launcher exits with that rank's code; Ctrl-C / SIGTERM reach every rank.
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

__all__ = ["main", "free_port"]


def free_port(addr="127.0.0.1"):
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _parser():
    p = argparse.ArgumentParser(prog="python -m minidnn.distributed.run", allow_abbrev=False,
                                description="Start N processes of a training script for data-parallel training.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1, help="processes on this node")
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this node's index")
    p.add_argument("--master-addr", "--master_addr", default=None,
                   help="rank 0's address (default: $MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", "--master_port", type=int, default=None,
                   help="rank 0's port (default: $MASTER_PORT, else a free port on a single node)")
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL when stopping ranks")
    p.add_argument("-m", dest="module", action="store_true", help="the target is a module (python -m target)")
    p.add_argument("target", help="the script (or module with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return p


def _split(argv):
    """(launcher's arguments, target, script's arguments): the script's own options (say --nproc) must not reach
    the launcher's parser, which would take them for abbreviations of its own."""
    flags = {"-m", "-h", "--help"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in flags or (a.startswith("--") and "=" in a):
            i += 1
        elif a.startswith("-"):
            i += 2
        else:
            break
    return argv[:i], argv[i:i + 1], argv[i + 1:]


def main(argv=None):
    own, target, rest = _split(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(own + target)
    args.args = rest
    if args.nproc_per_node < 1:
        raise SystemExit(f"error: --nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise SystemExit(f"error: --node-rank {args.node_rank} must lie in 0..{args.nnodes - 1} (--nnodes "
                         f"{args.nnodes})")
    addr = args.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = args.master_port or (int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
    if port is None:
        if args.nnodes > 1:
            raise SystemExit("error: several nodes need an agreed --master-port")
        port = free_port(addr)
    world = args.nnodes * args.nproc_per_node
    key = os.environ.get("MINIDNN_DIST_AUTHKEY") or secrets.token_hex(16)
    if args.nnodes > 1 and not os.environ.get("MINIDNN_DIST_AUTHKEY"):
        raise SystemExit("error: several nodes need the same MINIDNN_DIST_AUTHKEY in every node's environment")
    cmd = [sys.executable, "-u"] + (["-m", args.target] if args.module else [args.target]) + args.args
    procs = []
    for local in range(args.nproc_per_node):
        env = dict(os.environ, RANK=str(args.node_rank * args.nproc_per_node + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(args.nproc_per_node), MASTER_ADDR=addr,
                   MASTER_PORT=str(port), GROUP_RANK=str(args.node_rank), MINIDNN_DIST_AUTHKEY=key)
        procs.append(subprocess.Popen(cmd, env=env))
    return _watch(procs, args.grace)


def _stop(procs, grace):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _watch(procs, grace):
    def forward(signum, frame):
        _stop(procs, grace)
        raise SystemExit(128 + signum)
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(f"minidnn.distributed.run: rank {rank} exited with code {code}; stopping the other ranks",
                      file=sys.stderr, flush=True)
                _stop(procs, grace)
                return code if code > 0 else 128 - code       # killed by a signal: 128 + its number
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


if __name__ == "__main__":
    sys.exit(main())
