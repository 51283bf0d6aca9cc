"""The Parquet files of export --parquet read by Spark (pyspark in local
mode, a JVM started here): a directory of several machines' exports
partitioned by host and boot is one table to Spark as it is to DuckDB
(test_sql.py), and the per-register counts of each machine are its own
trace's, known by construction; the uint64 columns come as decimal(20,0)
with their values whole.

pyspark is not an extra of the tool (the files are plain Parquet; any engine
reads them): tests/setup.sh installs it into the test venv, with the Java
runtime it needs where it is missing."""

from __future__ import annotations

import os
import sys

import pytest
from ng_require import optional
from test_sql import BAR0, machines_store, script


def spark_session():
    optional("pyspark", None, "pyspark is not installed (tests/setup.sh installs it: "
                              "pip install pyspark, and a Java runtime)")
    from pyspark.sql import SparkSession

    # one core and a small heap: the host runs guests beside it
    return (SparkSession.builder.master("local[1]").appName("mmiotrace-ng-test")
            .config("spark.ui.enabled", "false").config("spark.driver.memory", "512m")
            .config("spark.sql.shuffle.partitions", "1").getOrCreate())


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = spark_session()
    yield session
    session.stop()


def test_spark_reads_a_directory_of_machines_as_one_table(spark, tmp_path, capsys):
    store, want = machines_store(tmp_path, capsys)
    records = (spark.read.option("basePath", str(store))
               .parquet(str(store / "*" / "*" / "records.parquet")))
    records.createOrReplaceTempView("records")
    rows = spark.sql("SELECT host, boot, register, kind, count(*) AS n FROM records "
                     "WHERE kind IN ('R', 'W') GROUP BY host, boot, register, kind").collect()
    assert {(r.host, str(r.boot), r.register, r.kind): r.n for r in rows} == want
    # Spark has no unsigned integers: phys is a decimal(20,0), whole
    phys = {int(r.phys) for r in spark.sql(
        "SELECT DISTINCT phys FROM records WHERE kind = 'W' AND host = 'a' AND boot = 1")
        .collect()}
    assert phys == {BAR0 + r[1] for r in script() if r[0] == "W"}
    assert dict(records.dtypes)["phys"] == "decimal(20,0)"
    # the devices of every machine, joined
    devices = (spark.read.option("basePath", str(store))
               .parquet(str(store / "*" / "*" / "devices.parquet")))
    devices.createOrReplaceTempView("devices")
    (n,) = spark.sql("SELECT count(*) FROM records r JOIN devices d "
                     "ON r.host = d.host AND r.boot = d.boot AND r.bdf = d.bdf "
                     "AND r.bar = d.bar WHERE r.kind = 'W'").collect()[0]
    assert n == sum(v for (_, _, _, k), v in want.items() if k == "W")
