"""The TCP rendezvous and the small control channel every process group keeps open.

    rank 0:  Listener((MASTER_ADDR, MASTER_PORT))  <- Client() from ranks 1..N-1, each says (rank, world_size)
             checks the ranks (each once, all in range, one world size), then answers every rank "ready"
             with what the backend wants shared (the NCCL unique id)

Framing and authentication come from the standard library's ``multiprocessing.connection`` (length-prefixed
pickled messages, HMAC challenge on connect with the launcher's random key ``MINIDNN_DIST_AUTHKEY``); nothing
here invents a wire format.  After the rendezvous the connections stay open as a star around rank 0: the CPU
backend's collectives and every backend's object collectives (``broadcast_object_list``, ``all_gather_object``)
travel through it, rank 0 checking that every rank called the same collective with the same shapes and dtypes.
"""
from __future__ import annotations

import os
import socket
import threading
import time
from multiprocessing.connection import Client, Listener

__all__ = ["Store", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 300.0       # seconds (PyTorch's default process-group timeout is 30 min; tests want less)


def _authkey():
    return os.environ.get("MINIDNN_DIST_AUTHKEY", "minidnn-rendezvous").encode()


class DistributedError(RuntimeError):
    """A collective failed on some rank (mismatched call, a rank that left, a timeout)."""


class Store:
    """The open star of connections around rank 0 (``conns[r]`` on rank 0, ``conn`` to rank 0 elsewhere)."""

    def __init__(self, addr, port, rank, world_size, timeout=DEFAULT_TIMEOUT, shared=None):
        self.addr, self.port, self.rank, self.world_size = addr, int(port), rank, world_size
        self.timeout = float(timeout)
        self.conns, self.conn, self.listener = {}, None, None
        self.shared = shared
        if world_size == 1:
            return
        if rank == 0:
            self._serve(shared)
        else:
            self._join()

    # -- rendezvous ---------------------------------------------------------------------------------------------------
    def _serve(self, shared):
        try:
            self.listener = Listener((self.addr, self.port), backlog=max(self.world_size, 16), authkey=_authkey())
        except OSError as e:
            raise DistributedError(f"init_process_group: rank 0 cannot listen on MASTER_ADDR:MASTER_PORT = "
                                   f"{self.addr}:{self.port} ({e}); is another job using the port?") from None
        hellos, errors, stopping = {}, [], threading.Event()

        def accept_all():
            while len(hellos) < self.world_size - 1:
                try:
                    conn = self.listener.accept()
                    rank, world = conn.recv()
                except Exception as e:          # a failed handshake (wrong key) ends this rendezvous
                    if not stopping.is_set():
                        errors.append(f"a connection failed its handshake ({type(e).__name__}: {e})")
                    return
                if world != self.world_size:
                    errors.append(f"rank {rank} was started with world_size={world}, rank 0 with "
                                  f"world_size={self.world_size}")
                elif not 0 < rank < self.world_size:
                    errors.append(f"a process joined with rank {rank}, outside 1..{self.world_size - 1}")
                elif rank in hellos:
                    errors.append(f"two processes joined with rank {rank}")
                hellos.setdefault(rank, conn)
                if errors:
                    return
        t = threading.Thread(target=accept_all, daemon=True)
        t.start()
        t.join(self.timeout)
        missing = sorted(set(range(1, self.world_size)) - set(hellos))
        if t.is_alive():                # wake the blocked accept() (its handshake then fails) before closing
            stopping.set()
            try:
                socket.create_connection((self.addr, self.port), timeout=1).close()
            except OSError:
                pass
            t.join(1)
        if errors or missing:
            why = "; ".join(errors) if errors else (
                f"timed out after {self.timeout:.0f} s waiting for rank(s) {missing} to join at "
                f"{self.addr}:{self.port}")
            for c in hellos.values():
                try:
                    c.send(("error", why))
                except OSError:
                    pass
            self.listener.close()
            raise DistributedError(f"init_process_group: rendezvous failed: {why}")
        self.conns = hellos
        for c in self.conns.values():
            c.send(("ready", shared))

    def _join(self):
        deadline = time.monotonic() + self.timeout
        last = None
        while True:
            try:
                self.conn = Client((self.addr, self.port), authkey=_authkey())
                break
            except (ConnectionRefusedError, FileNotFoundError, OSError) as e:    # rank 0 not listening yet
                last = e
                if time.monotonic() > deadline:
                    raise DistributedError(f"init_process_group: rank {self.rank} could not reach rank 0 at "
                                           f"{self.addr}:{self.port} within {self.timeout:.0f} s ({last})") from None
                time.sleep(0.05)
        self.conn.send((self.rank, self.world_size))
        status, payload = self._recv(self.conn, "rank 0")
        if status == "error":
            raise DistributedError(f"init_process_group: rendezvous failed: {payload}")
        self.shared = payload

    # -- messages -----------------------------------------------------------------------------------------------------
    def _recv(self, conn, who):
        if not conn.poll(self.timeout):
            raise DistributedError(f"rank {self.rank}: no message from {who} within {self.timeout:.0f} s (a rank is "
                                   "stuck or called a different collective)")
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise DistributedError(f"rank {self.rank}: {who} closed its connection (it exited or crashed)") from None

    def exchange(self, meta, payload, combine):
        """One collective through rank 0.  Every rank sends ``(meta, payload)``; rank 0 checks that all metas are
        equal (after dropping per-rank fields, see ``meta``'s "rank_local" entry), then replies to rank r with
        ``combine(payloads)[r]``.  Returns this rank's reply.  A mismatch raises on every rank."""
        if self.world_size == 1:
            return combine([payload])[0]
        if self.rank != 0:
            self.conn.send((meta, payload))
            status, reply = self._recv(self.conn, "rank 0")
            if status == "error":
                raise DistributedError(reply)
            return reply
        metas, payloads = [meta], [payload]
        try:
            for r in range(1, self.world_size):
                m, p = self._recv(self.conns[r], f"rank {r}")
                metas.append(m)
                payloads.append(p)
        except DistributedError as e:
            self._broadcast_error(str(e))
            raise
        bad = _mismatch(metas)
        if bad:
            self._broadcast_error(bad)
            raise DistributedError(bad)
        try:
            replies = combine(payloads)
        except Exception as e:
            msg = f"{meta.get('op', 'collective')}: {type(e).__name__}: {e}"
            self._broadcast_error(msg)
            raise DistributedError(msg) from e
        for r in range(1, self.world_size):
            self.conns[r].send(("ok", replies[r]))
        return replies[0]

    def _broadcast_error(self, msg):
        for c in self.conns.values():
            try:
                c.send(("error", msg))
            except OSError:
                pass

    def close(self):
        for c in list(self.conns.values()) + ([self.conn] if self.conn is not None else []):
            try:
                c.close()
            except OSError:
                pass
        if self.listener is not None:
            self.listener.close()
        self.conns, self.conn, self.listener = {}, None, None


def _mismatch(metas):
    """A sentence naming what differs between the ranks' calls, or None."""
    ref = {k: v for k, v in metas[0].items() if k != "local"}
    for r, m in enumerate(metas[1:], 1):
        mine = {k: v for k, v in m.items() if k != "local"}
        if mine != ref:
            keys = sorted(set(ref) | set(mine), key=str)
            diff = ", ".join(f"{k}: rank 0 {ref.get(k)!r} vs rank {r} {mine.get(k)!r}" for k in keys
                             if ref.get(k) != mine.get(k))
            if ref.get("op") == mine.get("op"):
                return f"ranks called {ref.get('op')} with mismatched arguments: {diff}"
            return (f"ranks called mismatched collectives: rank 0 called {ref.get('op')}, rank {r} called "
                    f"{mine.get('op')} ({diff})")
    return None
