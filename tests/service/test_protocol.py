"""Half-open connections are closed: a client that sends no (or half a) request line is dropped after the
header timeout (issue 15 item 10); headers over the size or line limit get 431 however they are split
(issues 35, 50); a body that does not arrive in time gets 408; one client holds a bounded number of
connections; every refusal is counted."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from ficco.service.core.config import Settings
from ficco.service.core.protocol import with_limits


async def _app(scope, receive, send):
    """Reads the whole body (as the service's body limit does), then answers ``ok``."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


REJECTED: list[str] = []


def _serve(**limits) -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    chosen = Settings(**{"HEADER_TIMEOUT_S": 0.2, "MAX_HEADER_BYTES": 4096, **limits})
    protocol = with_limits(chosen, REJECTED.append)
    config = uvicorn.Config(_app, http=protocol, log_level="warning", timeout_keep_alive=60)
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
        assert b"FICCO_MAX_HEADER_BYTES" in answer and REJECTED[-1] == "header_too_large"
        ok = socket.create_connection(("127.0.0.1", port))  # headers under the limit, a body over it
        body = b"b" * 100_000
        ok.sendall(b"POST / HTTP/1.1\r\nhost: x\r\nx-fine: " + b"a" * 3000 + b"\r\n")
        ok.sendall(b"content-length: %d\r\n\r\n" % len(body) + body)
        assert _answer(ok).startswith(b"HTTP/1.1 200")
        ok.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")  # and a second request on it
        assert _answer(ok).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True


def test_headers_over_the_limits_in_one_piece_or_byte_by_byte_get_431():
    """100 KiB of headers or 5,000 header lines sent whole (the parser completes them in one call), and
    5 KiB sent a byte at a time: each 431 before the app runs."""
    server, port = _serve(HEADER_TIMEOUT_S=5.0, MAX_HEADERS=100)
    try:
        before = len(REJECTED)
        whole = b"GET / HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n"
        many = b"GET / HTTP/1.1\r\nhost: x\r\n" + b"a: b\r\n" * 5000 + b"\r\n"
        for request in (whole, many, b"GET / HTTP/1.1\r\n" + b"a: b\r\n" * 101 + b"\r\n"):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(request)
            assert _answer(conn).startswith(b"HTTP/1.1 431")
        slow = socket.create_connection(("127.0.0.1", port))
        for byte in b"GET / HTTP/1.1\r\nx-big: " + b"a" * 5000:
            try:
                slow.send(bytes([byte]))
            except OSError:  # closed by the server once over the limit
                break
        assert _answer(slow).startswith(b"HTTP/1.1 431")
        fine = socket.create_connection(("127.0.0.1", port))
        fine.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n" + b"a: b\r\n" * 90 + b"\r\n")
        assert _answer(fine).startswith(b"HTTP/1.1 200")
        assert REJECTED[before:] == ["header_too_large"] * 4
    finally:
        server.should_exit = True


def test_a_body_that_does_not_arrive_in_time_gets_408():
    server, port = _serve(BODY_TIMEOUT_S=0.3)
    try:
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n" + b"a" * 10)
        started = time.monotonic()
        assert _answer(stalled).startswith(b"HTTP/1.1 408") and time.monotonic() - started < 3
        assert REJECTED[-1] == "body_timeout"
        whole = socket.create_connection(("127.0.0.1", port))  # a body that arrives is answered
        whole.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        assert _answer(whole).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True


def test_one_client_holds_a_bounded_number_of_connections():
    server, port = _serve(HEADER_TIMEOUT_S=5.0, MAX_CONNECTIONS_PER_CLIENT=3)
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        extra = socket.create_connection(("127.0.0.1", port))
        assert _closed_by_server(extra) and REJECTED[-1] == "connections_per_client"
        held.pop().close()
        time.sleep(0.2)
        again = socket.create_connection(("127.0.0.1", port))
        again.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        assert _answer(again).startswith(b"HTTP/1.1 200")
    finally:
        server.should_exit = True
