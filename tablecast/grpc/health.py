"""grpc.health.v1: the standard health service that Kubernetes' gRPC probes, grpcurl and
load balancers ask, its status kept per service name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grpc_health.v1 import health_pb2

from tablecast.grpc.http2 import Call, GrpcError, Kind, Method, Status

SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class Health:
    """The status of each service name; Watch streams see each change."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self._changed: asyncio.Event = asyncio.Event()
        self._stopping = False

    def set(self, name: str, status: int) -> None:
        if self._stopping or self.status.get(name) == status:
            return
        self.status[name] = status
        self._changed.set()
        self._changed = asyncio.Event()

    def stopping(self) -> None:
        """Every name NOT_SERVING from now on, whatever is set later."""
        for name in self.status:
            self.set(name, NOT_SERVING)
        self._stopping = True

    def check(
        self, request: health_pb2.HealthCheckRequest, call: Call
    ) -> health_pb2.HealthCheckResponse:
        status = self.status.get(request.service)
        if status is None:
            raise GrpcError(Status.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def watch(
        self, request: health_pb2.HealthCheckRequest, call: Call
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            changed = self._changed
            status = self.status.get(request.service, SERVICE_UNKNOWN)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await changed.wait()

    def methods(self) -> dict[str, Method]:
        decode = health_pb2.HealthCheckRequest.FromString
        return {
            f"/{SERVICE}/Check": Method(Kind.UNARY, decode, self.check),
            f"/{SERVICE}/Watch": Method(Kind.STREAM, decode, self.watch),
        }
