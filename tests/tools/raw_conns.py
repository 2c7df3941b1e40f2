"""Raw client connections for the process tests: idle ones, half-sent HTTP requests, and
what the server does with them. (lib.sh puts this directory on PYTHONPATH.)"""
import socket

# Half an HTTP request: a request line and a header, never the blank line that ends it.
HALF_GET = b"GET /health HTTP/1.1\r\nHost: x\r\n"
HALF_POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
# A Cap'n Proto RPC Bootstrap message (question 0), as every client sends first: one
# segment of five words, a Message whose union is `bootstrap` (8) pointing at a Bootstrap.
BOOTSTRAP = (0).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"".join(
    w.to_bytes(8, "little") for w in (0x0001000100000000, 8, 0x0001000100000000, 0, 0))


def address(text):
    """(host, port) from "host:port" or "scheme://host:port"."""
    host, port = text.split("://")[-1].rsplit(":", 1)
    return host, int(port)


class Conn:
    """One connection, what it has been sent and whether the server has closed it."""

    def __init__(self, addr, send=b""):
        self.sock = socket.create_connection(addr, timeout=10)
        if send:
            self.sock.sendall(send)
        self.received = b""
        self.closed = False

    def _read(self):
        chunk = self.sock.recv(65536)
        if chunk:
            self.received += chunk
        else:
            self.closed = True

    def open(self):
        """Reads what has arrived, without waiting; whether the server still holds it open."""
        self.sock.setblocking(False)
        try:
            while not self.closed:
                self._read()
        except BlockingIOError:
            pass
        except OSError:
            self.closed = True
        finally:
            self.sock.setblocking(True)
        return not self.closed

    def until_closed(self, timeout):
        """Everything the server sends until it closes the connection (None if it has not
        within timeout seconds)."""
        self.sock.settimeout(timeout)
        try:
            while not self.closed:
                self._read()
        except socket.timeout:
            return None
        except OSError:
            self.closed = True
        return self.received

    def answer(self, timeout=10):
        """The server's first HTTP answer, its head and its body (as long as its
        Content-Length says), as text: it may arrive in several pieces. None if it has not
        arrived whole within timeout seconds."""
        self.sock.settimeout(timeout)
        try:
            while True:
                head, blank, body = self.received.partition(b"\r\n\r\n")
                if blank:
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(body) >= length:
                        return (head + blank + body[:length]).decode(errors="replace")
                if self.closed:
                    return None
                self._read()
        except OSError:  # the timeout among them
            return None


def connect(addr, n, send=b""):
    return [Conn(addr, send) for _ in range(n)]


def held(conns):
    """How many of conns the server still holds open."""
    return sum(c.open() for c in conns)
