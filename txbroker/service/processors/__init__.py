"""Request processors: one module per family of request codes.

Each processor decodes its request with the typed header class of :mod:`txbroker.remoting.headers`
(``XxxHeader.from_ext(cmd.ext_fields)``, ``SendMessageRequestHeader.from_command(code, ext)``)
and its JSON body with :mod:`txbroker.remoting.bodies`; a missing, empty, ill-typed or
out-of-range field is a ``HeaderError`` naming the field, answered as an error response, never
an exception escaping to the transport.  What a processor still checks itself is broker state
(system topics, permissions, queue id against the topic's queues, sizes), refused with
:class:`.errors.Refusal`.  Answers are built from the typed response headers
(``SendMessageResponseHeader``, ``PullMessageResponseHeader``, ``OffsetResponseHeader``) and
body classes.  Processors talk to the store and services through their public methods only.
"""
