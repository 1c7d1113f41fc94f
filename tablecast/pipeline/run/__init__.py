"""Stage 4, run: Spark started, topics and catalog prepared, queries started and watched.

:mod:`.pipeline` starts an App's queries (each with the trigger
:mod:`.trigger` picks) and reports progress; :mod:`.explain` puts the plan in
words; :mod:`.spark` builds the session; :mod:`.standalone` is a local Spark
cluster for tests and benchmarks.
"""
