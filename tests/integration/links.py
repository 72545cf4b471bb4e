"""A TCP proxy on loopback that a test (or a benchmark) cuts and heals,
or stalls and resumes: the partitions of multi-server replication tests."""

import socket
import threading


class Link:
    """A TCP proxy from one server's consumer to another server; cut()
    drops its connections and refuses new ones until heal(); stall() holds
    what its connections carry (they stay open) until resume()."""

    def __init__(self, target_port):
        self.target = target_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.up = True
        self.open = []
        self.lock = threading.Lock()
        self.closed = False
        self.flowing = threading.Event()
        self.flowing.set()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return "ldap://127.0.0.1:%d" % self.port

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                # cut() may have come while this one was being set up.
                if not self.up:
                    client.close()
                    server.close()
                    continue
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                # Stalled: held here (bounded by the test that stalls).
                while not self.flowing.wait(0.1):
                    if self.closed:
                        return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self):
        with self.lock:
            self.up = False
            for s in self.open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass
            self.open = []

    def heal(self):
        self.up = True

    def stall(self):
        self.flowing.clear()

    def resume(self):
        self.flowing.set()

    def close(self):
        self.closed = True
        self.flowing.set()
        self.cut()
        self.sock.close()
