"""`--web.config.file`: TLS, basic auth and response headers, in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: ca.crt
      min_version: TLS12
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hashes, as htpasswd -nBC 12 or Python's bcrypt make them
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000

Everything is checked when the file is loaded, so a bad file at start is one
clear error. The file and the certificates it names are watched, so
certificates can rotate without a restart. A change that does not load keeps
the last good configuration, and the log says why.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import os
import ssl
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TOP_LEVEL = {"tls_server_config", "basic_auth_users", "http_server_config"}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
# Checked when a user is unknown, so a wrong user name costs as long as a wrong password.
_DUMMY_HASH = bcrypt.hashpw(b"not a password", bcrypt.gensalt(10))


class WebConfigError(ValueError):
    """The web configuration cannot be used; the message says which setting and why, never a secret."""


@dataclass(frozen=True)
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    watched: tuple[Path, ...] = ()  # The files whose change means "load again".


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{what} must be a mapping")
    return value


def _tls(raw: dict[str, Any], base: Path) -> tuple[ssl.SSLContext, list[Path]]:
    unknown = sorted(set(raw) - _TLS_KEYS)
    if unknown:
        raise WebConfigError(f"tls_server_config: unknown setting {unknown[0]!r}")
    if not raw.get("cert_file") or not raw.get("key_file"):
        raise WebConfigError("tls_server_config needs both cert_file and key_file")
    cert, key = base / str(raw["cert_file"]), base / str(raw["key_file"])
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise WebConfigError(f"tls_server_config: cannot load cert_file/key_file {cert.name}/{key.name}: "
                             f"{getattr(err, 'strerror', None) or err}") from None
    for setting, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if setting in raw:
            if raw[setting] not in _VERSIONS:
                raise WebConfigError(f"tls_server_config: {setting} must be one of {', '.join(_VERSIONS)}")
            setattr(context, attribute, _VERSIONS[raw[setting]])
    if "min_version" not in raw:
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # exporter-toolkit's default.
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config: client_auth_type must be one of {', '.join(_CLIENT_AUTH)}")
    files = [cert, key]
    if auth != "NoClientCert":
        if not raw.get("client_ca_file"):
            raise WebConfigError(f"tls_server_config: client_auth_type {auth} needs client_ca_file")
        ca = base / str(raw["client_ca_file"])
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as err:
            raise WebConfigError(f"tls_server_config: cannot load client_ca_file {ca.name}: "
                                 f"{getattr(err, 'strerror', None) or err}") from None
        context.verify_mode = _CLIENT_AUTH[auth]
        files.append(ca)
    return context, files


def load(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a web configuration file; raises WebConfigError."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise WebConfigError(f"cannot read {path.name}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise WebConfigError(f"{path.name} is not valid YAML: {err}") from None
    document = _mapping(document, path.name)
    unknown = sorted(set(document) - _TOP_LEVEL)
    if unknown:
        raise WebConfigError(f"{path.name}: unknown setting {unknown[0]!r}")
    users = {}
    for user, hashed in _mapping(document.get("basic_auth_users"), "basic_auth_users").items():
        encoded = str(hashed).encode()
        if not encoded.startswith((b"$2a$", b"$2b$", b"$2y$")):
            raise WebConfigError(f"basic_auth_users: the password of {user!r} is not a bcrypt hash")
        users[str(user)] = encoded
    headers = {str(k): str(v) for k, v in
               _mapping(_mapping(document.get("http_server_config"), "http_server_config").get("headers"),
                        "http_server_config.headers").items()}
    context: ssl.SSLContext | None = None
    files: list[Path] = []
    if document.get("tls_server_config") is not None:
        context, files = _tls(_mapping(document["tls_server_config"], "tls_server_config"), path.parent)
    return WebConfig(context, users, headers, (path, *files))


class Credentials:
    """Checks basic-auth headers against bcrypt hashes in constant time, remembering recent successes.

    bcrypt is deliberately slow (tens of milliseconds); a scraper sends the same credentials every few
    seconds, so a success is remembered by a digest of what was sent and checked against it with
    hmac.compare_digest, as exporter-toolkit caches its checks.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._verified: OrderedDict[bytes, bytes] = OrderedDict()  # digest of credentials -> hash they matched

    def check(self, users: dict[str, bytes], header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = users.get(user)
        digest = hashlib.sha256(f"{user}\0{password}".encode()).digest()
        with self._lock:
            remembered = self._verified.get(digest)
        if remembered is not None and hashed is not None and hmac.compare_digest(remembered, hashed):
            return True
        ok = bcrypt.checkpw(password.encode(), hashed if hashed is not None else _DUMMY_HASH) and hashed is not None
        if ok and hashed is not None:
            with self._lock:
                self._verified[digest] = hashed
                while len(self._verified) > self._size:
                    self._verified.popitem(last=False)
        return ok


log = logging.getLogger(__name__)

CHECK_SECONDS = 2.0  # How often the web config and its certificates are checked for changes.


class WebConfigWatcher:
    """Holds the current web configuration and loads it again when the file or its certificates change.

    The listening socket's TLS context is the one loaded at start; a rotated certificate is loaded into
    it in place, so new connections use it. Enabling or disabling TLS, or changing client_auth_type or
    TLS versions, needs a restart.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.current = load(self.path)
        self._stamps = self._mtimes(self.current)

    @staticmethod
    def _mtimes(config: WebConfig) -> tuple[float, ...]:
        stamps = []
        for watched in config.watched:
            try:
                stamps.append(watched.stat().st_mtime_ns)
            except OSError:
                stamps.append(-1)
        return tuple(stamps)

    async def watch(self, interval: float = CHECK_SECONDS) -> None:
        """`check` every `interval` seconds, for as long as the server runs."""
        while True:
            await asyncio.sleep(interval)
            self.check()

    def check(self) -> bool:
        """Load again if anything changed; True when a new configuration took effect."""
        stamps = self._mtimes(self.current)
        if stamps == self._stamps:
            return False
        self._stamps = stamps
        try:
            fresh = load(self.path)
        except WebConfigError as err:
            log.warning("web config not reloaded, keeping the last good one: %s", err)
            return False
        live = self.current.ssl_context
        if (live is None) != (fresh.ssl_context is None):
            log.warning("web config: turning TLS on or off needs a restart; keeping the last good one")
            return False
        if live is not None:
            cert, key = fresh.watched[1], fresh.watched[2]
            live.load_cert_chain(cert, key)  # Already checked by load(): new connections use it.
        self.current = WebConfig(live, fresh.users, fresh.headers, fresh.watched)
        self._stamps = self._mtimes(self.current)
        log.info("web config reloaded")
        return True
