"""Stage 3, compile: each planned query as Spark DataFrame operations.

:mod:`.query` reads a query's topics, applies its steps and builds its writer;
the steps are stateless (:mod:`.stateless`: Columns in the JVM, callables in
:mod:`.pyworker`) or per key (:mod:`.keyed` runs the cores of
:mod:`.aggregate`, :mod:`.transform`, :mod:`.join`, :mod:`.fk_join`; :mod:`.window`
per task), except a grouped stream's count or Spark aggregate function, which is
Spark's own aggregation (:mod:`.spark_aggregate`).
Rows travel in the :mod:`.envelope` as a :mod:`.flow`; :mod:`.codecs` turns
serdes into Column expressions; :mod:`.sink` and :mod:`.partition` write them.
Spark executors import these modules to run the steps: they import no Kafka
client and no HTTP library.
"""
