"""The anchors tablecast is measured against: Kafka Streams interactive queries and Redis.

- :mod:`bench.peers.kafka_streams`: builds and runs the Java reference app in
  ``kafka-streams-iq/`` (a KTable in RocksDB behind ``GET /keys/{k}``);
- :mod:`bench.peers.redis`: a throwaway ``redis-server`` plus ``redis-benchmark``.
"""
