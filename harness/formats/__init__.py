"""vLLM's benchmark result formats: ``vllm bench serve``'s result JSON (``vllm_bench``) and the
PyTorch OSS benchmark database records (``pytorch_oss``), written by ``kvbench export`` and read by
``kvbench import`` (docs/formats.md)."""
