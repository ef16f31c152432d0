"""Which pod holds each GPU, from the kubelet's pod-resources gRPC API (optional enrichment).

cgroups give a pod's UID; the kubelet's `PodResourcesLister/List` gives its
namespace and name, keyed by the device ids it allocated (GPU UUIDs). The
exporter joins the two on the GPU. The call goes through grpcio's generic
unary call with a small protobuf wire decoder, so no generated stubs or
protobuf runtime are needed; grpcio itself is imported only when the
enrichment is switched on.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import TypeAlias

LIST_METHOD = "/v1.PodResourcesLister/List"
Holder: TypeAlias = tuple[str, str, str]  # The namespace, pod and container holding a GPU.
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class PodResourcesUnavailable(Exception):
    """The kubelet's socket is missing or did not answer; the message says which."""


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) for each field of one protobuf message; length-delimited values as bytes."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == _VARINT:
            value, position = _varint(data, position)
            yield number, value
        elif wire_type == _LENGTH:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise ValueError("truncated field")
            yield number, data[position:position + length]
            position += length
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
        else:
            raise ValueError(f"unsupported wire type {wire_type}")


def _strings(message: bytes, number: int) -> list[str]:
    return [v.decode("utf-8", errors="replace") for n, v in fields(message) if n == number and isinstance(v, bytes)]


def _messages(message: bytes, number: int) -> list[bytes]:
    return [v for n, v in fields(message) if n == number and isinstance(v, bytes)]


def gpu_pods(response: bytes, resource_prefix: str = "nvidia.com/") -> dict[str, list[Holder]]:
    """GPU UUID -> the (namespace, pod, container) holding it, from a ListPodResourcesResponse.

    A time-sliced GPU (`GPU-...::2`) can be held by several containers at once.
    """
    holders: dict[str, list[Holder]] = defaultdict(list)
    for pod in _messages(response, 1):
        name = next(iter(_strings(pod, 1)), "")
        namespace = next(iter(_strings(pod, 2)), "")
        for container in _messages(pod, 3):
            container_name = next(iter(_strings(container, 1)), "")
            for devices in _messages(container, 2):
                if not next(iter(_strings(devices, 1)), "").startswith(resource_prefix):
                    continue
                for device_id in _strings(devices, 2):
                    uuid = device_id.split("::", 1)[0]
                    if (namespace, name, container_name) not in holders[uuid]:
                        holders[uuid].append((namespace, name, container_name))
    return dict(holders)


class PodResourcesClient:
    """Calls the kubelet's pod-resources socket; one short call per GPU collection."""

    def __init__(self, socket_path: str, timeout_seconds: float = 1.0) -> None:
        import grpc  # Optional dependency: only users who switch the enrichment on need it.

        self._grpc = grpc
        self.socket_path = socket_path
        self._timeout = timeout_seconds
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._list = self._channel.unary_unary(
            LIST_METHOD, request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw
        )

    def gpu_pods(self) -> dict[str, list[Holder]]:
        try:
            return gpu_pods(self._list(b"", timeout=self._timeout))
        except self._grpc.RpcError as err:
            raise PodResourcesUnavailable(f"kubelet pod-resources: {err.code().name}") from None
        except ValueError as err:
            raise PodResourcesUnavailable(f"kubelet pod-resources: malformed answer: {err}") from None

    def close(self) -> None:
        self._channel.close()
