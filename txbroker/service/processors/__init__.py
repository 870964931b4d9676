"""Request processors: one module per family of request codes.

Each processor decodes its request with the typed header class of :mod:`txbroker.remoting.headers`
(``XxxHeader.from_ext(cmd.ext_fields)``, ``SendMessageRequestHeader.from_command(code, ext)``)
and its JSON body with :mod:`txbroker.remoting.bodies`; a missing, empty, ill-typed or
out-of-range field is a ``HeaderError`` naming the field.  What a processor still checks itself
is broker state (system topics, permissions, queue id against the topic's queues, sizes),
refused by raising :class:`txbroker.remoting.errors.Refusal` (of which ``HeaderError`` is one):
processors never build error responses, the transport answers every refusal that escapes a
handler with its code and remark.  Store statuses map to response codes through the tables of
:mod:`.statuses`.  Answers are built from the typed response headers
(``SendMessageResponseHeader``, ``PullMessageResponseHeader``, ``OffsetResponseHeader``) and
body classes.  Processors talk to the store and services through their public methods only.
"""
