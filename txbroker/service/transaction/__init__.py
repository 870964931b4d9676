"""Transactional messages, split as RocketMQ splits them.

``state`` (the half state machine, pure), ``history`` (who decided recent halves),
``index`` (the in-memory index of halves), ``oplog`` (op-record formats), ``messages`` (half,
final and discard-copy messages), ``bridge`` (all store I/O), ``recovery`` (replay and the
clean-close snapshot), ``check`` (the check service) and ``service`` (the facade the broker
and the processors use).  The request handlers are in
:mod:`txbroker.service.processors.transaction`.  Import the modules themselves: this package
imports nothing, so no module of it depends on the package as a whole.
"""
