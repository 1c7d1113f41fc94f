"""The gRPC front end (``serve --grpc-port``): the ``tablecast.v1.Tables`` service."""
