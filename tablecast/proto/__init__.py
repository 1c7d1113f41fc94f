"""tablecast's gRPC API: ``tables.proto`` and the message classes generated from it.

``tables_pb2.py`` is generated, not written: run ``tools/gen_proto.sh`` after
changing ``tables.proto`` (a unit test checks the two agree when grpcio-tools is
installed). The service's handlers are in :mod:`tablecast.grpc.service`.
"""
