"""Broker behaviour: request processors, transactional message service, check-back, name server."""
