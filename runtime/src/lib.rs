//! gt-runtime: the reference CPU interpreter (dispatcher, workers and backends grow here).
