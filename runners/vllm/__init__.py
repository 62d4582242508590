"""The runners that drive vLLM in process: which build is installed and importing it (``build``),
what is read from its scheduler after ``schedule()`` (``readings``), contiguous reservations inside
its block pool (``contiguous``), its steps as the driver's engine (``steps``), ``vllm-sched``
(``sched``: its scheduler, model mocked) and ``vllm`` (``engine``: the whole engine)."""
