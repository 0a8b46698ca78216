"""The TLS check before the first request to an ``https://`` URL: when the TCP connect succeeds but the TLS handshake
gets no answer (a plain-HTTP server waiting for a request line) or an answer that is not TLS (a plain-HTTP error
page), the user gets one line saying so ("is the server http://?"), within seconds, instead of a connect timeout
after ``--connect-timeout`` seconds that blames the network."""

from __future__ import annotations

import socket
import ssl
from urllib.parse import urlsplit, urlunsplit

from bench.errors import EndpointUnreachable

__all__ = ["check_tls", "HANDSHAKE_S"]

HANDSHAKE_S = 5.0
"""The longest wait for the server's first TLS answer once the TCP connect succeeded (a TLS server answers a
ClientHello in one round trip; 5 s is generous on any link a benchmark runs over)."""


def _as_http(url: str) -> str:
    p = urlsplit(url)
    return urlunsplit(("http", p.netloc, p.path, p.query, p.fragment))


def check_tls(url: str, connect_timeout_s: float = 10.0, handshake_s: float = HANDSHAKE_S) -> None:
    """For an ``https://`` URL: connect, then do a TLS handshake (certificate not checked here: the client checks
    it on the real connection). Nothing happens for other schemes, or when the TCP connect itself fails (the
    client's own error then says that the URL does not answer).

    Raises:
        EndpointUnreachable: the TCP connect succeeded and the TLS handshake got no answer within ``handshake_s``,
            an answer that is not TLS, or the connection closed: what a plain-HTTP server does. A TLS server that
            refuses the handshake (an alert) is left to the client, whose error names the cause.
    """
    p = urlsplit(url)
    if p.scheme != "https" or not p.hostname:
        return
    port = p.port or 443
    where = f"{p.hostname}:{port}"
    try:
        sock = socket.create_connection((p.hostname, port), timeout=connect_timeout_s)
    except OSError:
        return
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    hint = f"is the server http://? (try {_as_http(url)})"
    try:
        sock.settimeout(handshake_s)
        with ctx.wrap_socket(sock, server_hostname=p.hostname):
            return
    except TimeoutError:
        raise EndpointUnreachable(f"TLS handshake with {where} failed: the TCP connect succeeded, but no TLS answer "
                                  f"came within {handshake_s:g} s; {hint}") from None
    except (ssl.SSLEOFError, ConnectionError) as e:
        raise EndpointUnreachable(f"TLS handshake with {where} failed: the server closed the connection "
                                  f"({type(e).__name__}); {hint}") from None
    except ssl.SSLError as e:
        if "WRONG_VERSION_NUMBER" in str(e) or "record layer" in str(e):
            raise EndpointUnreachable(f"TLS handshake with {where} failed: the server answered, but not in TLS "
                                      f"({e.reason}); {hint}") from None
        return  # a TLS server that refused this handshake: the client's real connection reports why
    except OSError:
        return
    finally:
        sock.close()
