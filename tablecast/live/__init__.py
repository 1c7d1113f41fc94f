"""Live tables: watches over SSE, WebSocket and gRPC, fed from the table topics.

:mod:`.service` checks a watch request and takes its starting point,
:mod:`.hub` keeps the node's watches and dispatches records to them,
:mod:`.feed` reads the table topics, :mod:`.sse`, :mod:`.websocket` and
:mod:`.rpc` are the transports. See docs/operations.md ("Watches") for the
choices and their measurements.
"""
