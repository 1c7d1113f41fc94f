"""The HTTP front end of a serving node: the app (route matching, the request gate), the
event-loop HTTP/1.1 server and its WebSocket, the OpenAPI document, and the read
processes (``serve --processes N``) that answer plain key reads beside the node.
"""
