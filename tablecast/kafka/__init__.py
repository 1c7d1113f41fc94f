"""Kafka I/O: partitioning, topics, the catalog, and a local broker for development."""
