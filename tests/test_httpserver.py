"""ovsproxy.httpserver's pure parts: the request reader's bounds, the Host check, the
rate-limited log (the servers themselves: tests/e2e/test_http_hostile.py and
tests/healthcheck/test_service_health.py)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ovsproxy.httpserver import (
    Limits,
    RateLimitedLog,
    RequestError,
    host_is_local_name,
    read_request,
)

LIMITS = Limits()


async def parse(data: bytes) -> object:
    reader = asyncio.StreamReader(limit=max(LIMITS.max_request_line, LIMITS.max_header_bytes))
    reader.feed_data(data)
    reader.feed_eof()
    return await read_request(reader, LIMITS)


async def status_of(data: bytes) -> int:
    with pytest.raises(RequestError) as caught:
        await parse(data)
    return caught.value.status


async def test_a_request_is_read_with_its_path_and_headers() -> None:
    request = await parse(b"GET /status?x=1 HTTP/1.1\r\nHost: 127.0.0.1:10249\r\nA: b\r\n\r\n")
    assert request == type(request)("GET", "/status", {"host": "127.0.0.1:10249", "a": "b"})


async def test_oversized_and_malformed_requests_get_their_status() -> None:
    assert await status_of(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n") == 414
    assert await status_of(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n") == 414
    assert await status_of(b"GET / HTTP/1.1\r\n" + b"A: b\r\n" * 65 + b"\r\n") == 431
    assert await status_of(b"GET / HTTP/1.1\r\nA: " + b"b" * 20_000 + b"\r\n\r\n") == 431
    headers = (b"A: " + b"b" * 8000 + b"\r\n") * 3  # each within the line bound, 24 KB together
    assert await status_of(b"GET / HTTP/1.1\r\n" + headers + b"\r\n") == 431
    assert await status_of(b"\x16\x03\x01\x02\r\n\r\n") == 400
    assert await status_of(b"GET / HTTP/1.1\r\nno colon\r\n\r\n") == 400
    assert await status_of(b"GET / HTTP/1.1\r\nA: b\r\n") == 400  # closed within the headers


@given(st.binary(max_size=2000))
def test_any_bytes_are_a_request_or_a_status_never_another_error(data: bytes) -> None:
    async def run() -> None:
        try:
            await parse(data)
        except RequestError as exc:
            assert exc.status in (400, 414, 431)
        except ConnectionResetError:
            assert data == b""  # closed before a request line

    asyncio.run(run())


@pytest.mark.parametrize(
    ("host", "local"),
    [
        (None, True),
        ("127.0.0.1:10249", True),
        ("127.0.0.1", True),
        ("[::1]:10249", True),
        ("localhost:10249", True),
        ("LOCALHOST", True),
        ("10.0.0.5:10249", True),
        ("attacker.example:10249", False),
        ("attacker.example", False),
        ("127.0.0.1.nip.io:10249", False),
        ("", False),
    ],
)
def test_the_host_check_refuses_names_a_rebinding_page_sends(host: str | None, local: bool) -> None:
    assert host_is_local_name(host) is local


def test_the_log_says_once_per_interval_and_counts_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = RateLimitedLog(logging.getLogger("test.httpserver"), interval=3600)
    with caplog.at_level(logging.WARNING):
        for i in range(1000):
            log.emit("bad", "bad request %d", i)
        log.emit("other", "another kind")
        log.interval = 0
        log.emit("bad", "bad request again")
    assert [r.getMessage() for r in caplog.records] == [
        "bad request 0",
        "another kind",
        "bad request again (999 more like it not logged)",
    ]
