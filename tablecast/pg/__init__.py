"""The PostgreSQL front end (``serve --pg-port``): the wire protocol (``wire``,
``transport``, ``session``, ``server``), SQL made into the read core's queries
(``statements``, ``types``, ``relations``), the catalogs tools read (``information_schema``,
``pg_catalog``) and the live form (``subscribe``)."""
