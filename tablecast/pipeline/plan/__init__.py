"""Stage 2, the plan: what the DSL built, and where it is cut into Spark queries.

:mod:`.nodes` is the tree of operators the DSL builds; :mod:`.queries` cuts it
into streaming queries chained by topics; :mod:`.wire` holds the private byte
formats of those internal topics. Pure Python: no Spark needed.
"""
