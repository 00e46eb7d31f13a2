"""One raw HTTP request against a test server on loopback (the server tests' shared client helper)."""

import http.client
from urllib.parse import urlparse


def http_request(url: str, method: str, path: str, body: bytes | None = None, timeout: float = 120):
    """``(status, headers, body bytes)`` of one request to ``url`` + ``path`` (a JSON content type with a body)."""
    u = urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()
