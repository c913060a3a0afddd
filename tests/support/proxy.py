"""A TCP proxy between a client and PostgreSQL that can freeze or lose a reply.

Threads forward bytes both ways. :meth:`Proxy.freeze` stops forwarding without closing
anything, like a network that drops packets without a reset: reads on the client wait
and its connects hang after the TCP handshake. :meth:`Proxy.lose_reply_after` lets
the next client message containing a marker (``b"COMMIT"``) reach the server, waits for
the server's reply, which proves the server has done it, and then cuts the client's
connection instead of passing the reply on.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.lose_next_reply = False
        self.cut = threading.Event()

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class Proxy:
    """Listens on 127.0.0.1 (a free port) and forwards each connection to ``target``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thawed = threading.Event()
        self._thawed.set()
        self._lock = threading.Lock()
        self._pairs: list[_Pair] = []
        self._marker: bytes | None = None
        self.replies_lost = 0
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def freeze(self) -> None:
        """Stop forwarding in both directions; nothing is closed."""
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def lose_reply_after(self, marker: bytes) -> None:
        """Cut the connection that next sends ``marker``, once the server has replied to it."""
        with self._lock:
            self._marker = marker

    def close(self) -> None:
        self._closed = True
        self._thawed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            pair = _Pair(client, server)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump_up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(pair,), daemon=True).start()

    def _pump_up(self, pair: _Pair) -> None:
        """Client to server; arms the lost reply when the marker goes by."""
        try:
            while True:
                chunk = pair.client.recv(65536)
                if not chunk:
                    break
                self._thawed.wait()
                with self._lock:
                    if self._marker is not None and self._marker in chunk:
                        self._marker = None
                        pair.lose_next_reply = True
                pair.server.sendall(chunk)
        except OSError:
            pass
        self._drop(pair)

    def _pump_down(self, pair: _Pair) -> None:
        """Server to client; drops the armed reply and cuts the client off."""
        try:
            while True:
                chunk = pair.server.recv(65536)
                if not chunk:
                    break
                self._thawed.wait()
                if pair.lose_next_reply:
                    with self._lock:
                        self.replies_lost += 1
                    break
                pair.client.sendall(chunk)
        except OSError:
            pass
        self._drop(pair)

    def _drop(self, pair: _Pair) -> None:
        pair.close()
        with self._lock, contextlib.suppress(ValueError):
            self._pairs.remove(pair)
