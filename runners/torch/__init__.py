"""The ``torch`` runner: a small Llama-style decoder with seeded random weights (``model``) over a
contiguous or a paged KV cache (``kv``), stepped by kvbench's scheduler (``runner``)."""
