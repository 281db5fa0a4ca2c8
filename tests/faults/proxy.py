"""A TCP fault proxy: one per (waitroom instance, Redis port), so a fault
between one instance and Redis leaves the others' links alone.

Faults, each switched on and off by the nemesis while connections live:
- latency: every chunk in either direction waits `delay_ms` first;
- loss: TCP does not lose bytes, it retransmits them late, so a lost
  segment is a chunk held for one retransmission timeout (200 ms, Linux's
  minimum RTO) with probability `loss`;
- partition "blackhole": nothing flows and new connections hang, as behind
  a dropped route; bytes held meanwhile flow after the heal (what TCP
  retransmission does when the connection outlived the partition);
- partition "reset": every connection is reset and new ones are refused,
  as when a firewall rejects.

Replies from Redis that name a Redis port (a Sentinel's master address,
CLUSTER SLOTS/NODES/SHARDS, a MOVED or ASK redirect, a +switch-master
message) are rewritten to this instance's proxy for that port, so each
connection the instance opens passes through its own proxies. Ports are
all five digits (free ports from the ephemeral range), so a rewrite keeps
every RESP length intact.
"""

import random
import re
import socket
import threading
import time

RTO_S = 0.2
_PORT = re.compile(rb"(?<=[:\n ])(\d{5})(?=[\r@ ,\n])")


class FaultProxy:
    def __init__(self, upstream_port, port):
        self.upstream_port, self.port = upstream_port, port
        self.port_map = {}
        self.delay_ms = 0
        self.loss = 0.0
        self.mode = "ok"  # ok | blackhole | reset
        self._conns = set()
        self._lock = threading.Lock()
        self._closed = False
        self._rng = random.Random(port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.settimeout(0.2)

    def start(self):
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def heal(self):
        self.delay_ms, self.loss, self.mode = 0, 0.0, "ok"

    def set_mode(self, mode):
        self.mode = mode
        if mode == "reset":
            self._reset_all()

    def _reset_all(self):
        with self._lock:
            conns = list(self._conns)
            self._conns.clear()
        for c in conns:
            try:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                c.close()
            except OSError:
                pass

    def close(self):
        self._closed = True
        self._reset_all()
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept_loop(self):
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _wait_passable(self, sock):
        """Blocks while a blackhole holds the link; False when the link was
        reset or the proxy closed meanwhile."""
        while self.mode == "blackhole" and not self._closed:
            time.sleep(0.05)
        return self.mode != "reset" and not self._closed and sock in self._conns

    def _serve(self, client):
        if self.mode == "reset":
            client.close()
            return
        with self._lock:
            self._conns.add(client)
        if not self._wait_passable(client):
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=2)
            upstream.settimeout(None)
        except OSError:
            with self._lock:
                self._conns.discard(client)
            client.close()
            return
        with self._lock:
            self._conns.add(upstream)
        threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
        self._pump(upstream, client, True)

    def _pump(self, src, dst, rewrite):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not self._wait_passable(src):
                    break
                if self.delay_ms:
                    time.sleep(self.delay_ms / 1000)
                if self.loss and self._rng.random() < self.loss:
                    time.sleep(RTO_S)
                if rewrite and self.port_map and b"127.0.0.1" in data:
                    data = _PORT.sub(self._rewrite_port, data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with self._lock:
                    self._conns.discard(s)
                try:
                    s.close()
                except OSError:
                    pass

    def _rewrite_port(self, m):
        mapped = self.port_map.get(int(m.group(1)))
        return str(mapped).encode() if mapped else m.group(1)
