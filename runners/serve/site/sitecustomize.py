"""Run at interpreter start by every Python process of a ``vllm serve`` that kvbench starts on
vLLM's CPU build (this directory is put first on the server's ``PYTHONPATH``): the API server,
its engine core and vLLM's model-inspection subprocess all hide the CPU build's CUDA-built media
packages, exactly as the in-process runners do (``runners.vllm.build.hide_media_modules``).
Nothing in the user's environment is changed."""

import importlib

# A top-level module (Python imports it by this name), so kvbench is imported by its full name.
importlib.import_module("kvbench.runners.vllm.build").hide_media_modules()
