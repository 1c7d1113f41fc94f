"""A node's read processes (``serve --processes N``): plain key reads answered by more
processes than the node's one, from RocksDB secondary instances of its stores.

- :mod:`~tablecast.node.read_bulletin`: what the node tells them (tables, partitions);
- :mod:`~tablecast.node.read_processes`: the node starts, feeds and stops them;
- :mod:`~tablecast.http.readers.process`: one read process's main;
- :mod:`~tablecast.http.readers.key_reads`: the reads it answers itself;
- :mod:`~tablecast.http.readers.relay`: its connections, piped to the node for the rest.
"""
