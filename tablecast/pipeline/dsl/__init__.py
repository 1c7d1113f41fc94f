"""Stage 1, the DSL: the stream and table handles users chain.

Each operator returns a new handle on a new plan node (:mod:`..plan.nodes`);
nothing is computed here.
"""
