"""How reads another node answers leave this one (``serve --forwarding``).

- ``short``: those leaving together go as one batch (:mod:`tablecast.query.coalesce`),
  and plain key reads go straight from the HTTP parser into it
  (:mod:`tablecast.query.short_path`);
- ``batched``: batched, every read through the router;
- ``one-by-one``: each read alone over a pooled connection.

The last two are there to compare against (``python -m bench cluster``).
"""

FORWARDING = ("short", "batched", "one-by-one")
