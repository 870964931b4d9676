"""One place that builds the SparkSession, so every step runs unchanged on ``local[*]`` and on
``spark://…``.  Workers must run the same interpreter as the driver (they import txbroker)."""

from __future__ import annotations

import os
import sys


def session(master: str = "local[*]", app: str = "txbroker-bench", shuffle_partitions: int = 8):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        # A local run talks to itself only: keep Spark's driver and block manager on loopback
        # instead of the first interface's address.  A cluster driver must stay reachable.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app)
    if local:
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    spark = (builder
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
