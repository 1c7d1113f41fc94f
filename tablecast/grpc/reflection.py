"""Server reflection (grpc.reflection.v1alpha), so grpcurl, grpcui and Postman list and call
the services without their proto files: grpcio-reflection's answers, served here."""

from __future__ import annotations

from collections.abc import Iterable

from grpc_reflection.v1alpha import reflection, reflection_pb2

from tablecast.grpc.http2 import Call, Kind, Method

SERVICE = reflection.SERVICE_NAME


def methods(services: Iterable[str]) -> dict[str, Method]:
    """The reflection service's one method, describing `services` and itself."""
    servicer = reflection.ReflectionServicer((*services, SERVICE))

    def answer(
        request: reflection_pb2.ServerReflectionRequest, call: Call
    ) -> reflection_pb2.ServerReflectionResponse:
        return next(iter(servicer.ServerReflectionInfo((request,), None)))

    return {
        f"/{SERVICE}/ServerReflectionInfo": Method(
            Kind.EACH, reflection_pb2.ServerReflectionRequest.FromString, answer
        )
    }
