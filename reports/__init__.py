"""Reports: pure functions from records (Parquet) to tables, with thin renderers."""
