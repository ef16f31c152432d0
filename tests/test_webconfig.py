"""--web.config.file: TLS, client certificates, basic auth, headers and reloads, against the exporter process."""

import asyncio
import base64
import socket
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpufleet.devtools.net import free_port, listening
from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.devtools.processes import stop as stop_process
from gpufleet.devtools.waiting import wait_for
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.server import build_app
from gpufleet.exporter.webconfig import Credentials, WebConfigError, load


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def issue(directory: Path, name: str, subject: str, extension: str) -> None:
    """A P-256 key and a certificate for it, signed by the test CA in `directory`."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    (directory / f"{name}.ext").write_text(extension + "\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=gpufleet test CA", cwd=directory)
    issue(directory, "server", "/CN=first", "subjectAltName=IP:127.0.0.1")
    issue(directory, "rotated", "/CN=second", "subjectAltName=IP:127.0.0.1")
    issue(directory, "client", "/CN=prometheus", "extendedKeyUsage=clientAuth")
    return directory


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


class Exporter:
    """The exporter process, with its log read as it is written, so a test can wait for a line."""

    def __init__(self, config: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "exporter", "--gpu.backend=sim", "--sim.gpus=1",
             f"--path.sysfs={FIXTURE_SYSFS}", f"--web.listen-address=127.0.0.1:{self.port}",
             f"--web.config.file={config}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self._reader.start()
        wait_for(lambda: listening(self.port), 20, "exporter start", self.process)

    def logged(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def get(self, scheme: str = "https", user: str | None = None, password: str = "", context=None):
        request = urllib.request.Request(f"{scheme}://127.0.0.1:{self.port}/metrics")
        if user is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def stop(self) -> str:
        stop_process(self.process)
        self._reader.join(10)
        return "".join(self.lines)


def client_context(pki: Path, certificate: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if certificate:
        context.load_cert_chain(pki / "client.crt", pki / "client.key")
    return context


def write_config(path: Path, pki: Path, users: dict[str, str] | None = None, client_auth: str = "NoClientCert",
                 cert: str = "server") -> None:
    lines = ["tls_server_config:", f"  cert_file: {pki / cert}.crt", f"  key_file: {pki / cert}.key",
             f"  client_auth_type: {client_auth}"]
    if client_auth != "NoClientCert":
        lines.append(f"  client_ca_file: {pki / 'ca.crt'}")
    lines += ["http_server_config:", "  headers:", "    X-Content-Type-Options: nosniff"]
    if users:
        lines.append("basic_auth_users:")
        lines += [f"  {user}: '{bcrypt_hash(password)}'" for user, password in users.items()]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.e2e
def test_tls_with_basic_auth_and_headers(tmp_path, pki):
    config = tmp_path / "web.yml"
    write_config(config, pki, users={"prometheus": "s3cret"})
    exporter = Exporter(config)
    try:
        context = client_context(pki)
        status, headers, body = exporter.get(user="prometheus", password="s3cret", context=context)
        assert status == 200 and b"gpufleet_collector_success" in body
        assert headers["X-Content-Type-Options"] == "nosniff"
        status, headers, _ = exporter.get(context=context)
        assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="gpufleet"'
        assert exporter.get(user="prometheus", password="wrong", context=context)[0] == 401
        assert exporter.get(user="nobody", password="s3cret", context=context)[0] == 401
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # Plain HTTP to the TLS port is refused.
            exporter.get(scheme="http", user="prometheus", password="s3cret")
    finally:
        output = exporter.stop()
    assert "s3cret" not in output and "$2b$" not in output and "Traceback" not in output


@pytest.mark.e2e
def test_client_certificates_are_required_and_verified(tmp_path, pki):
    config = tmp_path / "web.yml"
    write_config(config, pki, client_auth="RequireAndVerifyClientCert")
    exporter = Exporter(config)
    try:
        assert exporter.get(context=client_context(pki, certificate=True))[0] == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            exporter.get(context=client_context(pki, certificate=False))
    finally:
        exporter.stop()


def served_certificate(port: int, pki: Path) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        subject = dict(item[0] for item in tls.getpeercert()["subject"])
    return subject["commonName"]


@pytest.mark.slow
@pytest.mark.e2e
def test_users_and_certificates_reload_and_a_bad_change_keeps_the_last_good(tmp_path, pki):
    config = tmp_path / "web.yml"
    write_config(config, pki, users={"alice": "one"})
    exporter = Exporter(config)
    context = client_context(pki)
    try:
        assert exporter.get(user="alice", password="one", context=context)[0] == 200
        assert served_certificate(exporter.port, pki) == "first"
        write_config(config, pki, users={"alice": "two"}, cert="rotated")
        wait_for(lambda: exporter.get(user="alice", password="two", context=context)[0] == 200, 15,
                 "the new password in effect")
        assert exporter.get(user="alice", password="one", context=context)[0] == 401
        assert served_certificate(exporter.port, pki) == "second"  # Rotated without a restart.
        config.write_text("basic_auth_users: [not, a, mapping]\n")
        refused = "web config not reloaded, keeping the last good one: basic_auth_users must be a mapping"
        wait_for(lambda: exporter.logged(refused), 15, "the bad change noticed")
        assert exporter.get(user="alice", password="two", context=context)[0] == 200
    finally:
        exporter.stop()


@pytest.mark.e2e
@pytest.mark.parametrize(("text", "message"), [
    ("tls_server_config: {cert_file: missing.crt, key_file: missing.key}",
     "cannot load cert_file/key_file missing.crt/missing.key"),
    ("tls_server_config: {cert_file: a.crt}", "needs both cert_file and key_file"),
    ("basic_auth_users: {alice: plaintext}", "the password of 'alice' is not a bcrypt hash"),
    ("tls_settings: {}", "unknown setting 'tls_settings'"),
    ("basic_auth_users: [x]", "basic_auth_users must be a mapping"),
    (": : :", "is not valid YAML"),
])
def test_a_bad_file_at_start_is_one_clear_error(tmp_path, text, message):
    config = tmp_path / "web.yml"
    config.write_text(text + "\n")
    process = subprocess.run(
        [sys.executable, "-m", "gpufleet", "exporter", "--gpu.backend=sim", f"--web.config.file={config}",
         f"--web.listen-address=127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=30)
    assert process.returncode == 1
    assert message in process.stderr and "Traceback" not in process.stderr
    assert str(tmp_path) not in process.stderr  # File names, not host paths.


def test_client_auth_settings_are_checked(tmp_path, pki):
    config = tmp_path / "web.yml"
    config.write_text(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key, "
                      "client_auth_type: RequireAndVerifyClientCert}\n")
    with pytest.raises(WebConfigError, match="needs client_ca_file"):
        load(config)
    config.write_text(f"tls_server_config: {{cert_file: {pki}/server.crt, key_file: {pki}/server.key, "
                      "min_version: SSL3}\n")
    with pytest.raises(WebConfigError, match="min_version must be one of TLS10, TLS11, TLS12, TLS13"):
        load(config)


def test_credentials():
    users = {"alice": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))}
    credentials = Credentials()
    good = "Basic " + base64.b64encode(b"alice:pw").decode()
    assert credentials.check(users, good) and credentials.check(users, good)  # The second from memory.
    for header in ("Bearer abc", "Basic !!!", *("Basic " + base64.b64encode(pair).decode()
                                                for pair in (b"no-colon", b"alice:nope", b"bob:pw"))):
        assert not credentials.check(users, header), header
    users["alice"] = bcrypt.hashpw(b"new", bcrypt.gensalt(4))  # A changed hash invalidates what was remembered.
    assert not credentials.check(users, good)


async def test_beyond_max_requests_the_answer_is_503_at_once():
    app = build_app(Exposition([]), max_requests=1)
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request):
        entered.set()
        await release.wait()
        return web.Response(text="done")

    app.router.add_get("/slow", slow)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        held = asyncio.create_task(client.get("/slow"))
        await asyncio.wait_for(entered.wait(), 5)
        refused = await client.get("/metrics")
        # Refused while the first request is still held: the answer did not wait for a free slot.
        assert refused.status == 503 and not held.done()
        release.set()
        assert (await held).status == 200
        assert (await client.get("/metrics")).status == 200
    finally:
        await client.close()


@pytest.mark.e2e
def test_the_remediators_webhook_takes_a_client_certificate_and_a_bearer_token(pki, tmp_path):
    """`gpufleet remediate` reads the same web config: with client certificates required, a caller without one
    is refused at the handshake; with one, a wrong token is refused (401), the right one reaches the webhook."""
    config, token = tmp_path / "web.yml", tmp_path / "token"
    write_config(config, pki, client_auth="RequireAndVerifyClientCert")
    token.write_text("s3cret\n")
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "gpufleet", "remediate", f"--web.listen-address=127.0.0.1:{port}",
                                f"--web.config.file={config}", f"--web.token-file={token}"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: listening(port), 20, "remediate start", process)

        def post(context: ssl.SSLContext, secret: str) -> int:
            request = urllib.request.Request(f"https://127.0.0.1:{port}/webhook", data=b"{}", method="POST",
                                             headers={"Authorization": f"Bearer {secret}"})
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    return response.status
            except urllib.error.HTTPError as err:
                return err.code

        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
            post(client_context(pki), "s3cret")
        assert post(client_context(pki, certificate=True), "wrong") == 401
        assert post(client_context(pki, certificate=True), "s3cret") == 400  # Through: `{}` is no webhook.
    finally:
        stop_process(process)
