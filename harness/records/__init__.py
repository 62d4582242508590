"""What a run leaves on disk: the Parquet schema, the recorder that writes one run, the results
directory (crash-safe writes, completeness, checked reads), its lock, provenance, the published
reference values and SLOs stored beside the records, and the rules for what kvbench may write."""
