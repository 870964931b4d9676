"""One place that builds the SparkSession, so every step runs unchanged on ``local[*]`` and on
``spark://…``.  Workers must run the same interpreter as the driver (they import txbroker)."""

from __future__ import annotations

import os
import sys


def session(master: str = "local[*]", app: str = "txbroker-bench", shuffle_partitions: int = 8):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.driver.memory", "1g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
