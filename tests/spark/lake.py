"""Reads verdict's lake with other engines, as an analyst would: Apache Spark with Delta
Lake's connector, delta-rs (the `deltalake` package), Polars, and DuckDB over the files of
the snapshot delta-rs loads. The Rust tests run it with
the Python of `scripts/services.sh up spark` and compare what it prints (JSON, one object
per line) with what verdict counts.

    lake.py count  TABLE            rows of a Delta table, by Spark
    lake.py watch  TABLE            counts again and again until stdin closes; "ready" first
    lake.py sql    ROOT FILE        runs the SQL in FILE on Spark over ROOT's tables
    lake.py others TABLE            rows of a Delta table by delta-rs, Polars and DuckDB
    lake.py spark-edit TABLE        the same writes by Spark: a checkpoint, OPTIMIZE, DELETE
                                    of tier 1, delta.appendOnly (then a checkpoint again)
    lake.py edit   TABLE            delta-rs writes to a table as another team's job would:
                                    a checkpoint, OPTIMIZE, DELETE of tier 1, the property
                                    delta.appendOnly, a checkpoint again; prints each step's
                                    version and the rows delta-rs reads after it
"""

import glob
import json
import os
import sys
import tempfile
import threading


def spark_session():
    from pyspark.sql import SparkSession

    jars_dir = os.environ["VERDICT_DELTA_JARS"]
    jars = [
        j
        for j in sorted(glob.glob(os.path.join(jars_dir, "*.jar")))
        if os.path.basename(j).startswith(("delta-spark", "delta-storage"))
    ]
    return (
        SparkSession.builder.master("local[2]")
        .appName("verdict-lake-check")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog",
            "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        )
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        # Spark makes its (unused) warehouse folder where it runs unless told: a temporary
        # one, so no run leaves a `spark-warehouse/` in the caller's folder.
        .config("spark.sql.warehouse.dir", tempfile.mkdtemp(prefix="verdict-spark-warehouse-"))
        .getOrCreate()
    )


def say(obj):
    print(json.dumps(obj, default=str), flush=True)


def count(spark, table):
    return spark.read.format("delta").load(table).count()


def main(argv):
    what = argv[1]
    if what == "others":
        import deltalake
        import duckdb
        import polars as pl

        table = argv[2]
        dt = deltalake.DeltaTable(table)
        # Every column read, not counted from the statistics: each engine must take every
        # column's type as the files hold it.
        n_delta_rs = dt.to_pyarrow_table().num_rows
        n_polars = pl.read_delta(table).height
        # DuckDB reads the files of the snapshot, never a glob of the folder (which would
        # also see files that are removed, or not committed yet).
        files = dt.file_uris()
        n_duckdb = (
            duckdb.execute("SELECT count(*) FROM read_parquet(?)", [files]).fetchone()[0]
            if files
            else 0
        )
        say(
            {
                "delta_rs": n_delta_rs,
                "polars": n_polars,
                "duckdb": n_duckdb,
                "version": dt.version(),
            }
        )
        return
    if what == "edit":
        import deltalake

        table = argv[2]

        def step(name):
            dt = deltalake.DeltaTable(table)
            rows = dt.to_pyarrow_table()
            tier1 = sum(1 for t in rows.column("tier").to_pylist() if t == 1)
            p = dt.protocol()
            say(
                {
                    "step": name,
                    "version": dt.version(),
                    "rows": rows.num_rows,
                    "tier1": tier1,
                    "writer": p.min_writer_version,
                    "reader": p.min_reader_version,
                }
            )
            return dt

        dt = step("start")
        dt.create_checkpoint()
        step("checkpoint")
        dt.optimize.compact()
        dt = step("optimize")
        dt.delete("tier = 1")
        dt = step("delete")
        dt.alter.set_table_properties({"delta.appendOnly": "true"})
        dt = step("property")
        dt.create_checkpoint()
        step("checkpoint")
        # At the interpreter's exit the writers' thread pools abort the process now and then
        # ("terminate called without an active exception", 2 of 8 runs, after every step
        # was done and printed): leave without tearing them down, the output flushed.
        sys.stdout.flush()
        os._exit(0)
    spark = spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    if what == "count":
        say({"count": count(spark, argv[2])})
    elif what == "watch":
        table = argv[2]
        say({"count": count(spark, table)})
        say("ready")
        done = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
        while not done.is_set():
            say({"count": count(spark, table)})
    elif what == "spark-edit":
        table = argv[2]
        t = f"delta.`{table}`"

        def step(name):
            version = spark.sql(f"DESCRIBE HISTORY {t} LIMIT 1").collect()[0]["version"]
            detail = spark.sql(f"DESCRIBE DETAIL {t}").collect()[0]
            counts = spark.sql(
                f"SELECT COUNT(*) AS n, SUM(CASE WHEN tier = 1 THEN 1 ELSE 0 END) AS t1 FROM {t}"
            ).collect()[0]
            say(
                {
                    "step": name,
                    "version": version,
                    "rows": counts["n"],
                    "tier1": counts["t1"] or 0,
                    "writer": detail["minWriterVersion"],
                    "reader": detail["minReaderVersion"],
                }
            )

        def checkpoint():
            log = spark._jvm.org.apache.spark.sql.delta.DeltaLog
            log.forTable(spark._jsparkSession, table).checkpoint()

        step("start")
        checkpoint()
        step("checkpoint")
        spark.sql(f"OPTIMIZE {t}")
        step("optimize")
        spark.sql(f"DELETE FROM {t} WHERE tier = 1")
        step("delete")
        spark.sql(f"ALTER TABLE {t} SET TBLPROPERTIES ('delta.appendOnly' = 'true')")
        step("property")
        checkpoint()
        step("checkpoint")
    elif what == "sql":
        root, sql_file = argv[2], argv[3]
        for name in ["raw", "denied_hourly", "demand_hourly", "overage"]:
            path = os.path.join(root, {"denied_hourly": "rollup/denied_hourly", "demand_hourly": "rollup/demand_hourly"}.get(name, name))
            if os.path.isdir(os.path.join(path, "_delta_log")):
                spark.read.format("delta").load(path).createOrReplaceTempView(name)
        with open(sql_file) as f:
            sql = f.read()
        for row in spark.sql(sql).collect():
            say(row.asDict())
    else:
        raise SystemExit(f"unknown command {what!r}; see the docstring")
    spark.stop()


if __name__ == "__main__":
    main(sys.argv)
