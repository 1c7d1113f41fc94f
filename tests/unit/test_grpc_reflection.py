"""Server reflection under both names clients ask by: v1 (grpcurl and Postman try it first)
and v1alpha, each listing and describing the same services."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as pb

from tablecast.grpc import reflection
from tablecast.grpc.http2 import Server
from tablecast.grpc.service import SERVICE
from tablecast.kafka.broker import free_port


def test_v1_and_v1alpha_list_and_describe_the_same_services() -> None:
    asks = [
        pb.ServerReflectionRequest(list_services=""),
        pb.ServerReflectionRequest(file_containing_symbol=reflection.V1),
        pb.ServerReflectionRequest(file_containing_symbol=SERVICE),
    ]

    async def main() -> Any:
        server = Server(reflection.methods((SERVICE,)))
        port = free_port()
        await server.start("127.0.0.1", port, None)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                out = {}
                for name in reflection.SERVICES:
                    call = channel.stream_stream(
                        f"/{name}/ServerReflectionInfo",
                        request_serializer=pb.ServerReflectionRequest.SerializeToString,
                        response_deserializer=pb.ServerReflectionResponse.FromString,
                    )
                    out[name] = [a async for a in call(iter(asks), timeout=10)]
                return out
        finally:
            await server.stop(0.5)

    answers = asyncio.run(main())
    expected = {SERVICE, reflection.V1, reflection.ALPHA}
    for name, (listed, v1_file, tables_file) in answers.items():
        assert {s.name for s in listed.list_services_response.service} == expected, name
        (raw,) = v1_file.file_descriptor_response.file_descriptor_proto
        file = descriptor_pb2.FileDescriptorProto.FromString(raw)
        assert file.package == "grpc.reflection.v1", name
        method = file.service[0].method[0]
        assert (method.name, method.input_type) == (
            "ServerReflectionInfo",
            ".grpc.reflection.v1.ServerReflectionRequest",
        )
        assert tables_file.file_descriptor_response.file_descriptor_proto, name
    # built once, whatever asks again
    assert reflection.methods(()).keys() == {
        f"/{n}/ServerReflectionInfo" for n in reflection.SERVICES
    }
