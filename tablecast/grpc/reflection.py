"""Server reflection, so grpcurl, grpcui and Postman list and call the services without their
proto files: grpcio-reflection's answers, served here under both names clients ask by
(``grpc.reflection.v1``, which newer clients try first, and ``v1alpha``).

The two versions are the same messages under two package names. grpcio-reflection ships
only v1alpha, so v1's file is v1alpha's renamed, added to the default descriptor pool
(where reflection finds every service it describes); one servicer answers both.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

from tablecast.grpc.http2 import Call, Kind, Method

ALPHA = reflection.SERVICE_NAME
V1 = "grpc.reflection.v1.ServerReflection"
SERVICES = (V1, ALPHA)


def _add_v1() -> None:
    """Put v1's file (v1alpha's, renamed) into the default pool, once."""
    pool = descriptor_pool.Default()
    try:
        pool.FindServiceByName(V1)
        return
    except KeyError:
        pass
    old, new = ".grpc.reflection.v1alpha.", ".grpc.reflection.v1."
    proto = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(proto)
    proto.name = "grpc/reflection/v1/reflection.proto"
    proto.package = "grpc.reflection.v1"
    for kind in proto.message_type:
        for field in kind.field:
            if field.type_name:  # a message field (set on no other)
                field.type_name = field.type_name.replace(old, new)
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new)
            method.output_type = method.output_type.replace(old, new)
    pool.AddSerializedFile(proto.SerializeToString())


def methods(services: Iterable[str]) -> dict[str, Method]:
    """The reflection services' one method, describing `services` and themselves."""
    _add_v1()
    servicer = reflection.ReflectionServicer((*services, *SERVICES))

    def answer(
        request: reflection_pb2.ServerReflectionRequest, call: Call
    ) -> reflection_pb2.ServerReflectionResponse:
        return next(iter(servicer.ServerReflectionInfo((request,), None)))

    method = Method(Kind.EACH, reflection_pb2.ServerReflectionRequest.FromString, answer)
    return {f"/{name}/ServerReflectionInfo": method for name in SERVICES}
