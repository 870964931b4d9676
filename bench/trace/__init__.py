"""The PySpark trace bench: generate a traffic trace, replay it against a broker, verify every
outcome, report.  One module per step (``generate``, ``replay``, ``verify``, ``report``,
``run``); ``spec`` holds the schemas and the parsing shared by all of them."""
