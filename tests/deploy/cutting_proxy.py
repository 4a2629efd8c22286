"""A real TCP forwarder on loopback that cuts every connection a fixed time after it opened,
to lose an SSH connection in the middle of a command (tests of the exit-3 contract); or drops
the link on demand (`drop`): nothing passes either way and nothing is closed, as when a network
goes away, so neither end learns that the other has gone."""

from __future__ import annotations

import socket
import threading
import time


class CuttingProxy:
    def __init__(self, target: tuple[str, int], cut_after_s: float):
        self.target, self.cut_after_s = target, cut_after_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cuts = 0
        self.dropped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            pair = (client, upstream)
            for a, b in (pair, pair[::-1]):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()
            threading.Thread(target=self._cut, args=pair, daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (data := src.recv(65536)) and not self.dropped.is_set():
                dst.sendall(data)
        except OSError:
            pass

    def _cut(self, *socks: socket.socket) -> None:
        time.sleep(self.cut_after_s)
        self.cuts += 1
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def drop(self) -> None:
        self.dropped.set()

    def close(self) -> None:
        self.server.close()
