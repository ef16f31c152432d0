"""HTTP behaviour of the exporter: content negotiation, methods and the extra endpoints."""

import asyncio
import gzip

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpufleet.devtools.paths import FIXTURE_SYSFS
from gpufleet.exporter.collector.thermal_zone import ThermalZoneCollector
from gpufleet.exporter.exposition import Exposition
from gpufleet.exporter.scheduler import ScheduledCollector
from gpufleet.exporter.server import accepts_gzip, build_app
from gpufleet.exporter.tree import DiskTree

from helpers import parse, series


@pytest.fixture
async def client():
    collector = ScheduledCollector(ThermalZoneCollector(DiskTree(FIXTURE_SYSFS)), interval=15, timeout=15)
    await collector.tick()
    client = TestClient(TestServer(build_app(Exposition([collector])), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


async def test_plain_and_gzip_bodies_carry_the_same_metrics(client):
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"}, auto_decompress=False)
    assert plain.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in plain.headers
    plain_body = await plain.read()
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip, deflate"}, auto_decompress=False)
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert zipped.headers["Vary"] == "Accept-Encoding"
    zipped_body = await zipped.read()
    assert len(zipped_body) < len(plain_body)
    assert parse(gzip.decompress(zipped_body)) == parse(plain_body)
    samples = parse(plain_body)
    assert samples[series("gpufleet_thermal_zone_temperature_celsius", zone="thermal_zone1", type="acpitz")] == 27.8
    assert samples[series("gpufleet_collector_success", collector="thermal_zone")] == 1


async def test_head_is_answered_and_other_methods_are_refused(client):
    assert (await client.head("/metrics")).status == 200
    for method in ("POST", "PUT", "DELETE"):
        response = await client.request(method, "/metrics")
        assert response.status == 405
        assert "Traceback" not in await response.text()
    assert (await client.get("/nope")).status == 404
    assert (await client.get("/../etc/passwd")).status == 404


async def test_landing_page_and_health(client):
    landing = await client.get("/")
    assert landing.status == 200
    page = await landing.text()
    assert 'href="metrics"' in page and "thermal_zone" in page
    health = await client.get("/healthz")
    assert health.status == 200 and await health.text() == "ok\n"


@pytest.mark.parametrize(
    ("header", "expected"),
    [("gzip", True), ("deflate, gzip;q=0.5", True), ("gzip;q=0", False), ("identity", False), ("", False),
     ("*", True), ("br, GZIP", True), ("gzip;q=nonsense", False)],
)
def test_accept_encoding_parsing(header, expected):
    assert accepts_gzip(header) is expected


async def _raw(client, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(4096), 5)
    finally:
        writer.close()


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", b"400"),
    (b"\x16\x03\x01\x00\xa5garbage\r\n\r\n", b"400"),
    (b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", b"404"),
    (b"GET /metrics HTTP/9.9\r\nHost: x\r\n\r\n", b"400"),
])
async def test_malformed_requests_get_a_4xx_and_no_traceback(client, request_bytes, status):
    answer = await _raw(client, request_bytes)
    assert answer.split(b" ")[1] == status, answer[:200]
    assert b"Traceback" not in answer
