"""Benchmarks and the PySpark traffic-trace tools."""
