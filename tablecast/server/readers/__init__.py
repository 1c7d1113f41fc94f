"""A node's read processes (``serve --processes N``): plain key reads answered by more
processes than the node's one, from RocksDB secondary instances of its stores.

- :mod:`~tablecast.server.readers.feed`: what the node tells them (tables, partitions);
- :mod:`~tablecast.server.readers.supervise`: the node starts, feeds and stops them;
- :mod:`~tablecast.server.readers.process`: one read process's main;
- :mod:`~tablecast.server.readers.answer`: the reads it answers itself;
- :mod:`~tablecast.server.readers.relay`: its connections, piped to the node for the rest.
"""
