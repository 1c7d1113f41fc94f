"""The HTTP side of a serving node: routes, handlers and the server process."""
