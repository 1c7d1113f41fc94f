"""The pipeline: an App's streams and tables, computed by Spark Structured Streaming.

A pipeline goes through four stages, one subpackage each, and each imports
only from the stages before it (``tests/unit/test_imports.py`` checks):

1. :mod:`.dsl` — the handles users chain (``app.stream(...).filter(...)``);
   every operator adds a node to the plan.
2. :mod:`.plan` — the plan's nodes, and where it is cut into streaming
   queries chained by internal topics (pure Python).
3. :mod:`.compile` — each query as DataFrame operations: decoding, stateless
   and per-key steps, dead letters, the Kafka writer.
4. :mod:`.run` — Spark started, topics and catalog prepared, the queries
   started with their triggers, progress reported; ``explain``.

:mod:`.app` (``tc.App``) ties them together: it gives out the DSL's first
handles and hands what they built to the later stages on ``run()``.
"""
