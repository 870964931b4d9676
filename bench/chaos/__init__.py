"""Reliability harness: chaos driver (SIGKILL under transactional load), TCP fault proxy and
network fuzzer.  ``python -m txbroker.bench.chaos`` runs the chaos driver and prints its report table."""
