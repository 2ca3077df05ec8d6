"""Who may call the server: an API key on `/v1/*`, and which web pages' origins may (CORS).

The key works as OpenAI's, vLLM's and llama.cpp's servers do: clients send
`Authorization: Bearer KEY`; a request without it, or with another key, gets 401 with OpenAI's
error body. `/health` and `/metrics` stay open, for load balancers and Prometheus.

A browser asks before a page on another origin may call the API: an `OPTIONS` preflight that names
the method and headers it wants. The server answers for the origins in `allowed_origins` ("*" for
any) and says nothing for the others, so the browser blocks them; the API itself needs no cookie,
so origins are never given credentials.
"""

from __future__ import annotations

import hmac
import ipaddress

from memwall.serving.api import ApiError

PREFLIGHT_MAX_AGE_S = 600
ALLOWED_METHODS = "GET, POST, OPTIONS"
ALLOWED_HEADERS = "Authorization, Content-Type"


class Access:
    def __init__(self, api_key: str | None = None, allowed_origins=()):
        if api_key is not None and not api_key.strip():
            raise ValueError("the API key must not be empty (leave it out to serve without one)")
        self.api_key = api_key
        self.allowed_origins = tuple(o.strip().rstrip("/") for o in allowed_origins if o.strip())

    def check_key(self, route: str, authorization: str | None) -> None:
        """Raise ApiError(401) if `route` needs the key and `authorization` does not carry it."""
        if self.api_key is None or not route.startswith("/v1/"):
            return
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                kind="invalid_request_error",
            )
        if not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            shown = given.strip()[:3] + "..." + given.strip()[-4:] if len(given) > 8 else "***"
            raise ApiError(401, f"Incorrect API key provided: {shown}.", code="invalid_api_key")

    def allows(self, origin: str | None) -> bool:
        return bool(origin) and ("*" in self.allowed_origins or origin in self.allowed_origins)

    def cors_headers(self, origin: str | None) -> list[tuple[str, str]]:
        """Headers for any answer to a page from `origin` (none if it is not allowed)."""
        if not self.allows(origin):
            return []
        return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]

    def preflight_headers(self, origin: str | None) -> list[tuple[str, str]]:
        """What a preflight from `origin` may do, besides cors_headers (none if not allowed)."""
        if not self.allows(origin):
            return []
        return [
            ("Access-Control-Allow-Methods", ALLOWED_METHODS),
            ("Access-Control-Allow-Headers", ALLOWED_HEADERS),
            ("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_S)),
        ]


def is_loopback(host: str) -> bool:
    """True if only this machine can reach `host` ("localhost", 127.x.x.x, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve to anything
