"""Request processors: one module per family of request codes.

Each processor validates its header fields through :mod:`.fields` (a missing or ill-typed field
is a clear error response, never an exception escaping to the transport) and talks to the
store and services through their public methods only.
"""
