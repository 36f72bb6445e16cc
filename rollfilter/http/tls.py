"""TLS: the context a transport verifies servers with (loading a CA file, once), and what a failed
verification says."""

from __future__ import annotations

import ssl

from rollfilter.http.errors import CaFileError, causes


def tls_context(*, verify: bool = True, cafile: str | None = None) -> ssl.SSLContext:
    """The system's trust store (SSL_CERT_FILE and SSL_CERT_DIR apply), the CAs in `cafile`
    instead (as curl's --cacert reads them), or, without `verify`, no checks at all.

    It reads `cafile` once, here: CaFileError when it is no readable PEM file of certificates."""
    try:
        context = ssl.create_default_context(cafile=cafile)
    except ssl.SSLError:  # an OSError too: first
        raise CaFileError("holds no PEM certificates") from None
    except OSError as exc:
        raise CaFileError(f"cannot be read: {exc.strerror or exc}") from None
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def certificate_failure(exc: BaseException) -> str | None:
    """Why the server's certificate was refused, if that is what `exc` comes from."""
    for cause in causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause.verify_message or str(cause)
    return None
