"""The ``tablecast`` command line."""
