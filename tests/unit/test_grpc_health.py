"""The gRPC health status follows the node's readiness, and a stopping server says
NOT_SERVING before it stops (grpc.health.v1 on the node's own gRPC server, asked by grpcio)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tablecast.grpc import service
from tablecast.grpc.health import Health
from tablecast.grpc.http2 import Server
from tablecast.kafka.broker import free_port


def test_health_follows_readiness_and_stopping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "HEALTH_POLL_S", 0.01)

    async def main() -> list[int]:
        ready = [False]
        health = Health()
        server = Server(health.methods())
        port = free_port()
        await server.start("127.0.0.1", port)
        served = service.Served(server, health, lambda: ready[0])
        seen = []
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            async def status() -> int:
                await asyncio.sleep(0.1)
                ask = health_pb2.HealthCheckRequest(service=service.SERVICE)
                return (await stub.Check(ask, timeout=5)).status

            seen.append(await status())
            ready[0] = True
            seen.append(await status())
            ready[0] = False
            seen.append(await status())
            ready[0] = True
            seen.append(await status())
            watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
            stopping = asyncio.create_task(served.stop(1.0))
            seen.append((await watch.read()).status)
            await stopping
        return seen

    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert asyncio.run(main()) == [not_serving, serving, not_serving, serving, not_serving]
