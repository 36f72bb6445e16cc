"""TLS: the context a transport verifies servers with, whether a CA file can serve in it, and what a
failed verification says."""

from __future__ import annotations

import ssl

from rollfilter.http.errors import causes


def tls_context(*, verify: bool, cafile: str | None = None) -> ssl.SSLContext:
    """The system's trust store (SSL_CERT_FILE and SSL_CERT_DIR apply), the CAs in `cafile`
    instead (as curl's --cacert reads them), or, without `verify`, no checks at all."""
    context = ssl.create_default_context(cafile=cafile)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def ca_file_problem(path: str) -> str | None:
    """What keeps the PEM file at `path` from serving as the CAs to trust ("holds no PEM
    certificates", "cannot be read: ..."), or None when it can. It reads the file."""
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError:  # an OSError too: first
        return "holds no PEM certificates"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return None


def certificate_failure(exc: BaseException) -> str | None:
    """Why the server's certificate was refused, if that is what `exc` comes from."""
    for cause in causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause.verify_message or str(cause)
    return None
