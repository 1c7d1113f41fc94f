"""The ``tablecast`` command line (SPEC §2)."""
