"""What counts as running out of memory, for the runners that allocate real tensors (``torch``,
``vllm``): the exception becomes an ``oom`` row instead of a failure."""

from __future__ import annotations


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError (torch.cuda.OutOfMemoryError)
        return True
    if not isinstance(exc, (RuntimeError, ValueError)):
        return False
    # torch's allocators say so in a RuntimeError; vLLM refuses, in a ValueError at start-up, a KV
    # cache that does not fit.
    message = str(exc).lower()
    return "out of memory" in message or "less than requested memory for kv" in message
