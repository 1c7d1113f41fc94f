"""Live tables: watches fed from the table topics, served over SSE, WebSocket and gRPC.

:mod:`.service` checks a watch request and takes its starting point,
:mod:`.hub` keeps the node's watches and dispatches records to them,
:mod:`.topic_feed` reads the table topics, :mod:`.sse` and :mod:`.websocket` are
the HTTP transports (gRPC's is :mod:`tablecast.grpc.service`). See
docs/operations.md ("Watches") for the choices and their measurements.
"""
