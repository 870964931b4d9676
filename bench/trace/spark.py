"""One place that builds the SparkSession, so every step runs unchanged on ``local[*]`` and on
``spark://…``.  Workers must run the same interpreter as the driver (they import txbroker).

Spark talks a lot on the terminal: the JVM's start-up banner, "Using Spark's default log4j
profile", a WARN about the native hadoop library, progress bars.  A bench command's own output
drowns in it, so :func:`session` can send all of it to a log file instead: the driver JVM is
launched (through ``spark-submit``) with its stdout and stderr on that file, log4j2 is
configured by a properties file naming it, and the console progress bar is off.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

#: log4j2 configuration for a driver whose output goes to a file.  A File appender, not the
#: console: for an interactive-looking app (pyspark's) Spark filters console appenders down to
#: WARN, and INFO is what one wants when reading the log after a failure.  Parquet and jetty
#: stay quiet, as in Spark's own defaults (Parquet logs whole schemas at INFO).
_LOG4J2 = """\
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.parquet2.name = parquet
logger.parquet2.level = error
"""


def session(master: str = "local[*]", app: str = "txbroker-bench", shuffle_partitions: int = 8,
            log_file: str | Path | None = None):
    """The bench's SparkSession.

    ``log_file``: where the driver JVM's output and Spark's log go (truncated first); ``None``
    leaves them on the terminal at Spark's default level, progress bars included.  It applies
    only when this call starts the JVM: a session reusing a running one (``getOrCreate``)
    keeps the JVM's output where it already goes.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        # A local run talks to itself only: keep Spark's driver and block manager on loopback
        # instead of the first interface's address.  A cluster driver must stay reachable.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    settings = {"spark.master": master, "spark.app.name": app,
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": str(shuffle_partitions),
                "spark.sql.session.timeZone": "UTC",
                "spark.driver.memory": "1g"}
    if local:
        settings |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    if log_file is not None and SparkContext._gateway is None:
        settings["spark.ui.showConsoleProgress"] = "false"
        _start_logging_to(Path(log_file), SparkConf().setAll(settings.items()))
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _start_logging_to(log_file: Path, conf) -> None:
    """Launch the driver JVM with its output on ``log_file`` and start the SparkContext on it."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    log_file = log_file.absolute()
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_bytes(b"")
    fd, props = tempfile.mkstemp(prefix="txbroker-bench-log4j2-", suffix=".properties")
    try:
        with os.fdopen(fd, "w") as f:
            # log4j2 reads its properties with java.util.Properties: backslashes escape.
            f.write(_LOG4J2.format(path=str(log_file).replace("\\", "\\\\")))
        conf.set("spark.driver.extraJavaOptions",
                 f"-Dlog4j.configurationFile={Path(props).as_uri()}")
        # O_APPEND: the JVM's stderr and log4j's appender write to the same file.
        with open(log_file, "ab") as out:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": out, "stderr": out})
        SparkContext(conf=conf, gateway=gateway)
    finally:
        # log4j2 reads its configuration once, while the JVM starts.
        os.unlink(props)
