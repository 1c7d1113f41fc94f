"""Helpers the tests share: real processes on free ports, waiting with timeouts."""
