"""Whether vLLM's engine runs here: the installed build and the ``needs_engine`` mark the engine
tests share (``tests/runners/test_vllm_engine*.py``, ``test_serve.py``)."""

from __future__ import annotations

import pytest
from kvbench.runners.vllm import build as vllm_build
from kvbench.runners.vllm import engine as vllm_engine

BUILD = vllm_build.installed_build()
ENGINE_REASON = vllm_engine.VllmRunner().unavailable()
needs_engine = pytest.mark.skipif(ENGINE_REASON is not None, reason=f"the vLLM engine cannot run here: {ENGINE_REASON}")
