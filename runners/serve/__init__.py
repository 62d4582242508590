"""The ``serve`` runner: vLLM's OpenAI-compatible server started per cell (``process``) or attached
to, replayed by kvbench's HTTP client (``client``), ``/metrics`` scraped (``metrics``), the steps read
inside the server by kvbench's scheduler class (``scheduler``, with ``site`` on its PYTHONPATH), and
the runner that records it all (``runner``)."""
