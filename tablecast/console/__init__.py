"""The web console every node serves at ``/ui``.

A single page (``static/``: plain HTML, CSS and JavaScript, no build step and
nothing fetched from the internet) that reads the node's own HTTP API — the
cluster map from ``/v1/cluster``, tables and keys from ``/v1/tables``, live
values from the watch route — plus a few console routes (:mod:`.api`): node
details gathered from every node, the pipeline's progress and the latest dead
letters, both read from Kafka by :mod:`.feed`.
"""
