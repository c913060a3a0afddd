"""cyclone's store: every statement against cyclone's tables, and how it is sent.

Each module owns the rows and operations its name says (``claim``, ``completion``,
``rescue``, ``waits``, ``control``, ...); ``transitions`` lists, for each edge of
:data:`cyclone.states.EDGES`, the one builder that takes it. ``binds``, ``executor`` and
``deadline`` are how statements are sent: the user's bind, the executor protocol every
statement goes through (precompiled or built on the call), and the connections'
keepalives and read deadlines. Nothing outside this package builds or sends
SQL (a ruff rule and tests/test_store_boundary.py check it); the worker, the handles and
the public face call the functions here.
"""
