"""A serving node's process: it assembles the cluster side, the read core and the front
ends, runs them, supervises the read processes, exposes metrics and tunes the garbage
collector.
"""
