"""Half-open connections are closed: a client that sends no (or half a) request line is dropped after the
header timeout (issue 15 item 10); headers over the size limit get 431 (issue 35 item 7)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from ficco.service.core.protocol import with_header_limits


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _serve() -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app, http=with_header_limits(0.2, 4096), log_level="warning", timeout_keep_alive=60
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, sock.getsockname()[1]


def _closed_by_server(conn: socket.socket) -> bool:
    conn.settimeout(5)
    try:
        return conn.recv(1024) == b""
    except (TimeoutError, ConnectionResetError):
        return False


def test_half_open_connections_are_closed_but_requests_are_answered():
    server, port = _serve()
    try:
        silent = socket.create_connection(("127.0.0.1", port))
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET / HT")
        assert _closed_by_server(silent) and _closed_by_server(half)
        ok = socket.create_connection(("127.0.0.1", port))
        ok.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        ok.settimeout(5)
        answer = b""
        while not answer.endswith(b"ok"):
            answer += ok.recv(1024)
        assert answer.startswith(b"HTTP/1.1 200")
        ok.sendall(b"GET / HT")  # a half second request on a kept-alive connection
        assert _closed_by_server(ok)
    finally:
        server.should_exit = True


def _answer(conn: socket.socket) -> bytes:
    conn.settimeout(5)
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
        if answer.endswith(b"ok"):
            break
    return answer


def test_headers_over_the_limit_get_431_and_a_closed_connection():
    server, port = _serve()
    try:
        big = socket.create_connection(("127.0.0.1", port))
        big.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 8192)  # no end of headers yet
        answer = _answer(big)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
        assert b"FICCO_MAX_HEADER_BYTES" in answer
        ok = socket.create_connection(("127.0.0.1", port))  # headers under the limit, a body over it
        body = b"b" * 100_000
        ok.sendall(b"POST / HTTP/1.1\r\nhost: x\r\nx-fine: " + b"a" * 3000 + b"\r\n")
        ok.sendall(b"content-length: %d\r\n\r\n" % len(body) + body)
        assert _answer(ok).startswith(b"HTTP/1.1 200")
        ok.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # and a second request on it
        assert _answer(ok).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
