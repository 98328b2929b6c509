"""The one SMTP code path: send an EmailMessage with an EmailChannelConfig's settings.

Used by the email channel and by digests. Failures become DeliveryError: connection
problems and 4xx replies are retryable, 5xx replies, bad credentials and TLS verification
failures are not. The password is read from the environment at send time and never appears
in a message or a log.
"""

from __future__ import annotations

import functools
import logging
import os
import smtplib
import ssl
from email.message import EmailMessage

from changewatch.channels.base import DeliveryError
from changewatch.channels.config import EmailChannelConfig

__all__ = ["send_email", "smtp_password"]

log = logging.getLogger(__name__)


def smtp_password(config: EmailChannelConfig) -> str | None:
    """The SMTP password from `config.password_env`, None if none is configured.

    A configured variable that is unset or empty is an error: sending unauthenticated
    instead would hide the misconfiguration until the server rejects the mail.
    """
    if not config.password_env:
        return None
    password = os.environ.get(config.password_env)
    if not password:
        raise DeliveryError(
            f"email channel {config.name}: environment variable {config.password_env} "
            "(the SMTP password) is not set",
            retryable=False,
        )
    return password


def _tls_context(config: EmailChannelConfig) -> ssl.SSLContext:
    try:
        # Keyed by the file's modification time too: a CA file replaced on disk is read again.
        changed = os.stat(config.ca_file).st_mtime_ns if config.ca_file else None
        return _context(config.ca_file, changed)
    except (OSError, ssl.SSLError) as exc:
        raise DeliveryError(
            f"email channel {config.name}: cannot load ca_file {config.ca_file}: {exc}",
            retryable=False,
        ) from exc


@functools.lru_cache(maxsize=16)
def _context(ca_file: str | None, _changed: int | None) -> ssl.SSLContext:
    """A TLS context per CA file, built once: loading CAs takes some 20-40 ms of CPU, which
    every e-mail paid (as every webhook did, channels/webhook.py)."""
    return ssl.create_default_context(cafile=ca_file)


def _reply(code: int, text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return f"{code} {' '.join(text.split())}".strip()


def _response_error(where: str, code: int, text: bytes | str, what: str) -> DeliveryError:
    # RFC 5321: 4yz is a transient negative completion, 5yz a permanent one.
    return DeliveryError(f"{where}: {what}: {_reply(code, text)}", retryable=400 <= code < 500)


def send_email(
    message: EmailMessage,
    config: EmailChannelConfig,
    *,
    to_addrs: list[str] | None = None,
) -> dict[str, tuple[int, bytes]]:
    """Send `message` through the SMTP server of `config`.

    Recipients are `to_addrs`, else the message's To/Cc/Bcc; the envelope sender is its
    From. Returns the recipients the server refused when it accepted others (delivered to
    those, so not an error to retry); raises DeliveryError when nothing was delivered.
    """
    where = f"email channel {config.name} (smtp {config.host}:{config.port})"
    password = smtp_password(config)
    login = bool(config.username and password)
    if login and config.security == "none":
        raise DeliveryError(
            f"{where}: refusing to send SMTP credentials without TLS (security: none)",
            retryable=False,
        )
    context = _tls_context(config) if config.security != "none" else None
    try:
        if config.security == "ssl":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(
                config.host, config.port, timeout=config.timeout, context=context
            )
        else:
            smtp = smtplib.SMTP(config.host, config.port, timeout=config.timeout)
        with smtp:
            if config.security == "starttls":
                smtp.starttls(context=context)
                smtp.ehlo()
            if login:
                assert config.username is not None and password is not None
                smtp.login(config.username, password)
            refused = smtp.send_message(message, to_addrs=to_addrs)
    except DeliveryError:
        raise
    except smtplib.SMTPAuthenticationError as exc:
        raise _response_error(where, exc.smtp_code, exc.smtp_error, "login refused") from None
    except smtplib.SMTPNotSupportedError as exc:
        # No STARTTLS or no AUTH offered: the configuration and the server disagree.
        raise DeliveryError(f"{where}: {exc}", retryable=False) from None
    except smtplib.SMTPRecipientsRefused as exc:
        codes = [code for code, _ in exc.recipients.values()]
        details = "; ".join(f"{rcpt}: {_reply(*reply)}" for rcpt, reply in exc.recipients.items())
        raise DeliveryError(
            f"{where}: all recipients refused: {details}",
            retryable=all(400 <= code < 500 for code in codes),
        ) from None
    except smtplib.SMTPSenderRefused as exc:
        raise _response_error(where, exc.smtp_code, exc.smtp_error, "sender refused") from None
    except smtplib.SMTPResponseException as exc:
        raise _response_error(where, exc.smtp_code, exc.smtp_error, "server replied") from None
    except ssl.SSLCertVerificationError as exc:
        raise DeliveryError(
            f"{where}: TLS certificate verification failed: {exc.verify_message}",
            retryable=False,
        ) from None
    except (smtplib.SMTPException, OSError) as exc:
        # Connection refused or reset, timeouts, DNS, TLS handshake, server hung up.
        raise DeliveryError(f"{where}: {exc.__class__.__name__}: {exc}", retryable=True) from None
    if refused:
        log.warning(
            "%s: delivered, but some recipients were refused: %s",
            where,
            ", ".join(f"{rcpt} ({_reply(*reply)})" for rcpt, reply in refused.items()),
        )
    return refused
