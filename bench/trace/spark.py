"""One place that builds the SparkSession, so every step runs unchanged on ``local[*]`` and on
``spark://…``.

On a cluster the driver's address and the executors' Python are the two things a local run
never needs to be told:

* the driver is announced to the master and executors as ``driver_host``; left out, it is
  the local address of the route to the master (:func:`route_address`), the interface the
  cluster can reach, never ``localhost``;
* executors run ``executor_python``, a path or a name each worker resolves on its own
  ``PATH``: left out, ``$PYSPARK_PYTHON``, else ``pythonX.Y`` of the driver's version (a
  local run: this interpreter).  The job
  ships txbroker itself (:mod:`txbroker.bench.trace.ship`), so that Python needs only the
  third-party packages.

Spark talks a lot on the terminal: the JVM's start-up banner, "Using Spark's default log4j
profile", a WARN about the native hadoop library, progress bars.  A bench command's own output
drowns in it, so :func:`session` can send all of it to a log file instead: the driver JVM is
launched (through ``spark-submit``) with its stdout and stderr on that file, log4j2 is
configured by a properties file naming it, and the console progress bar is off.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

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


def is_local(master: str) -> bool:
    """``local``, ``local[N]``, ``local[*]``: the driver runs the tasks itself."""
    return master == "local" or master.startswith("local[")


def local_master(master: str, slots: int) -> str:
    """A local master with at least ``slots`` task slots: ``local[K]``, K = max(what ``master``
    asks for (``*``: the cores), ``slots``).  The bench's replay and delivery tasks run at
    once and wait on the network, not the CPU, so they may outnumber the cores.  Other
    masters are returned unchanged."""
    if not is_local(master):
        return master
    asked = master[len("local["):-1] if master.startswith("local[") else "1"
    cores = os.cpu_count() or 1
    try:
        n = cores if asked == "*" else int(asked)
    except ValueError:
        return master  # local[N,F] and the like: Spark's own forms, left as given
    return f"local[{max(n, slots)}]"


def route_address(master: str) -> str:
    """This machine's address on the route to ``master`` (``spark://HOST:PORT``; several
    masters are ``spark://H1:P1,H2:P2``): the address the master and executors can reach the
    driver at.  No packet is sent (a UDP socket is only connected)."""
    host, port = master_addresses(master)[0]
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(addr)
            return probe.getsockname()[0]
    except OSError as exc:
        raise OSError(None, f"cannot find a route to the Spark master ({exc.strerror or exc})",
                      master) from None


def master_addresses(master: str) -> list[tuple[str, int]]:
    """``spark://H1:P1,H2:P2`` -> [(H1, P1), (H2, P2)] (7077 when a port is left out)."""
    rest = master.split("://", 1)[-1]
    out = []
    for part in rest.split(","):
        parts = urlsplit(f"spark://{part}")
        out.append((parts.hostname or "127.0.0.1", parts.port or 7077))
    return out


def check_master(master: str, timeout: float = 5.0) -> None:
    """Fail at once, with one line naming the address, when no standalone master of
    ``master`` accepts a connection: Spark itself retries for a minute and then stops the
    context with a stack trace."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for host, port in master_addresses(master):
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    raise OSError(None, f"no Spark master answers ({'; '.join(reasons)})", master)


def session(master: str = "local[*]", app: str = "txbroker-bench", shuffle_partitions: int = 8,
            log_file: str | Path | None = None, driver_host: str | None = None,
            executor_python: str | None = None):
    """The bench's SparkSession.

    ``log_file``: where the driver JVM's output and Spark's log go (truncated first); ``None``
    leaves them on the terminal at Spark's default level, progress bars included.  It applies
    only when this call starts the JVM: a session reusing a running one (``getOrCreate``)
    keeps the JVM's output where it already goes, as it keeps its driver host and executor
    Python.  ``driver_host`` and ``executor_python``: see the module docstring.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    local = is_local(master)
    starting = SparkContext._gateway is None
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        # A local run talks to itself only: keep Spark's driver and block manager on loopback
        # instead of the first interface's address.  A cluster driver must stay reachable.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        driver_host = driver_host or "127.0.0.1"
    else:
        driver_host = driver_host or route_address(master)
    if starting:
        # PySpark hands this name to every executor, which runs it on its own machine (a
        # local run's executors are this machine: this very interpreter).
        os.environ["PYSPARK_PYTHON"] = (
            executor_python or os.environ.get("PYSPARK_PYTHON")
            or (sys.executable if local else "python{}.{}".format(*sys.version_info[:2])))
    settings = {"spark.master": master, "spark.app.name": app,
                "spark.ui.enabled": "false",
                "spark.sql.shuffle.partitions": str(shuffle_partitions),
                "spark.sql.session.timeZone": "UTC",
                # report brings result columns to the driver: as Arrow batches, not row by row
                "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.driver.memory": "1g",
                "spark.driver.host": driver_host}
    if local:
        settings["spark.driver.bindAddress"] = driver_host
    elif starting:
        check_master(master)
    if log_file is not None and starting:
        settings["spark.ui.showConsoleProgress"] = "false"
        _start_logging_to(Path(log_file), SparkConf().setAll(settings.items()))
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not local and starting:
        from txbroker.bench.trace.ship import ship

        ship(spark)
    return spark


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
