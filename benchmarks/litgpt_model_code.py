"""lit-gpt's own model code against trainfit's stand-in for it: what each saves for the backward.

The held-out lit-gpt LoRA cases (``data/heldout_memory.json``, phi-1.5 / StableLM-3B / Llama-2-7B on
an A100, Oct 2023) are predicted by simulating the transformers model of the same dimensions with
lit-gpt's loop quirks (chunked head, held logits: :mod:`heldout_mapping`) and its fused q/k/v
projection and LoRA (``fused_qkv``); without the last they came out 4-15 % under the published
peaks, more with each sample.  This script checks the simulation against lit-gpt's *model code*:
its phi-1.5 with LoRA on query and value (the cases' settings) is run for
real on this CPU under trainfit's live-bytes tracker, and the same job as the benchmark maps it is
simulated by trainfit for the same CPU (both on CPU semantics, so the kernels' saved tensors are
the same kind), at depths 2 and 3 and micro-batches 1 and 2 of the cases' 1044 tokens.  The
difference of differences gives the bytes each extra layer holds per token, and the bytes each
extra sample holds at the full 24 layers.

lit-gpt's code is the ``litgpt==0.1.0.dev1`` wheel from PyPI (Feb 2024: ``lit_gpt`` package, the
same LoRAQKVLinear and CausalSelfAttention as the Oct-2023 commit the table names, which is not
published as a wheel), downloaded into ``benchmarks/.cache`` on first use.  Its ``utils`` module
imports Lightning Fabric for checkpoint helpers the model never calls; installing Lightning would
pull another torch, so those imports are answered by empty stand-in modules (below).

Run: ``python benchmarks/litgpt_model_code.py`` (about 2 min; needs the package registry once)
→ results/litgpt_model_code.{json,md}.
"""

from __future__ import annotations

import copy
import functools
import importlib.abc
import importlib.machinery
import json
import subprocess
import sys
import types
import warnings
import zipfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache" / "litgpt-0.1.0.dev1"
RESULTS = HERE / "results"
WHEEL = "litgpt==0.1.0.dev1"
CASE = "litgpt_resource_tables_1xa100-40gb_phi-1.5_lora_none_mb{}"
SEQ = 1044
"""The cases' batch length: the longest Alpaca sample, forced into iteration 1."""
LAYERS = 24
VOCAB = 51200
"""phi-1.5's padded vocabulary (lit-gpt's config)."""
D_BYTES = 2048 * 2
"""One bf16 hidden-size vector of phi-1.5 (the unit the per-token terms are given in)."""
STUBBED = ("lightning", "lightning_utilities", "sentencepiece", "tokenizers")


@functools.cache
def _cases() -> dict[str, dict[str, Any]]:
    """The held-out cases by id (read once)."""
    data = json.loads((HERE / "data" / "heldout_memory.json").read_text())
    return {c["id"]: c for c in data["cases"]}


class _Empty(types.ModuleType):
    """Any attribute is a do-nothing class: enough for module-level imports never called."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        mod = _Empty(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module: Any) -> None:
        pass


def fetch() -> Path:
    """The unpacked wheel (downloaded once)."""
    if not (CACHE / "lit_gpt" / "lora.py").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-q",
                        "-d", str(CACHE)], check=True)
        wheel = next(CACHE.glob("litgpt-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            z.extractall(CACHE, [n for n in z.namelist() if n.startswith("lit_gpt/")])
    return CACHE


def _chunked_ce(logits: list[Any], targets: Any) -> Any:
    """lit-gpt ``utils.chunked_cross_entropy`` for a chunked head (the cases' loss)."""
    import torch

    logit_chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    target_chunks = [t.reshape(-1) for t in targets.split(logits[0].size(1), dim=1)]
    losses = [torch.nn.functional.cross_entropy(a, b, ignore_index=-1, reduction="none")
              for a, b in zip(logit_chunks, target_chunks, strict=True)]
    return torch.cat(losses).sum() / max(1, int((targets != -1).sum()))


def litgpt_point(layers: int, batch: int) -> int:
    """Peak live bytes of lit-gpt's forward + backward, really run on this CPU (weights made
    before the tracker starts: the peak is the step's own tensors)."""
    import lit_gpt.lora as lora
    import torch

    from trainfit.memory.tracker import LiveBytesTracker

    torch.manual_seed(0)
    cfg = lora.Config.from_name("phi-1_5", n_layer=layers, r=8, alpha=16, dropout=0.05,
                                to_query=True, to_key=False, to_value=True)
    torch.set_default_dtype(torch.bfloat16)  # --precision bf16-true: Fabric builds in bf16
    try:
        model = lora.GPT(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    model.max_seq_length = SEQ
    lora.mark_only_lora_as_trainable(model)
    x = torch.randint(0, cfg.vocab_size, (batch, SEQ))
    tracker = LiveBytesTracker()
    with tracker:
        tracker.set_phase("forward")
        logits = model(x, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        loss = _chunked_ce(logits, x[..., 1:])
        tracker.set_phase("backward")
        loss.backward()
    return tracker.peak.peak_bytes


def trainfit_point(layers: int, batch: int) -> int:
    """trainfit's simulated peak of the benchmark's mapping of the same case, for this CPU,
    minus what the model holds between steps (the real run above made its weights outside)."""
    from heldout_mapping import map_case
    from heldout_models import build_source
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step

    case = copy.deepcopy(_cases()[CASE.format(1)])
    case["model"]["num_hidden_layers"] = layers
    case["micro_batch"] = batch
    mapping = map_case(case)
    # the model code alone, as lit-gpt's side runs it: Fabric's fp32 copy of the returned logits
    # (fp32_outputs) is the wrapper's, outside the code compared here
    mapping.job["fp32_outputs"] = False
    source, _ = build_source(mapping)
    sim = simulate_step(JobSpec(**mapping.job), source, SimTarget(device="cpu"), steps=1)
    return sim.phase_peaks.get("backward@first", sim.peak_allocated_bytes) - sim.steady_bytes


def slopes(points: dict[tuple[int, int], int]) -> dict[str, float]:
    """Per token and layer (in d-vectors), and per sample at the full depth (bytes)."""
    per_layer = ((points[3, 2] - points[2, 2]) - (points[3, 1] - points[2, 1])) / SEQ
    per_sample_2 = points[2, 2] - points[2, 1]
    return {"per_token_layer_d": per_layer / D_BYTES,
            "per_sample_full_depth_bytes": per_sample_2 + (LAYERS - 2) * per_layer * SEQ}


def published_per_sample() -> list[float]:
    peak = {b: _cases()[CASE.format(b)]["measured"]["peak_memory_bytes"] for b in (1, 2, 4)}
    return [peak[2] - peak[1], (peak[4] - peak[2]) / 2]


def render(r: dict[str, Any]) -> str:
    lit, tf = r["litgpt"], r["trainfit"]
    pub = r["published_per_sample_bytes"]
    gap = min(pub) - tf["per_sample_full_depth_bytes"]
    code = lit["per_sample_full_depth_bytes"] - tf["per_sample_full_depth_bytes"]
    return "\n".join([
        "# lit-gpt's model code vs trainfit's stand-in (phi-1.5 LoRA q,v, 1044 tokens)", "",
        "Regenerate: `python benchmarks/litgpt_model_code.py`. Both run on this CPU: lit-gpt's own "
        f"code ({WHEEL}) for real under trainfit's live-bytes tracker, trainfit's simulation of the "
        "held-out benchmark's mapping of the same case for the CPU. d = one bf16 vector of the "
        "hidden size (4 KiB); MB = 10^6 bytes; published = the A100 peaks of the mb1/mb2/mb4 rows "
        "(torch.cuda.max_memory_allocated).", "",
        "| | per token and layer (d) | per sample at 24 layers (MB) |", "|---|---|---|",
        f"| lit-gpt code, measured on CPU | {lit['per_token_layer_d']:.2f} | "
        f"{lit['per_sample_full_depth_bytes'] / 1e6:,.0f} |",
        f"| trainfit, simulated for the CPU (fused_qkv) | {tf['per_token_layer_d']:.2f} | "
        f"{tf['per_sample_full_depth_bytes'] / 1e6:,.0f} |",
        f"| published on the A100, measured (mb1→2, mb2→4) | | "
        f"{pub[0] / 1e6:,.0f}, {pub[1] / 1e6:,.0f} |", "",
        f"lit-gpt's own code holds {code / 1e6:,.0f} MB more per sample than trainfit's "
        "simulation of it (the mapping sets `fused_qkv`: "
        "src/trainfit/model/fused_qkv.py). Without it — the transformers model with peft on "
        "separate q and v projections — the simulation held 210 MB less per sample (13.04 d per "
        "token and layer): lit-gpt's value heads are views of the fused qkv output (the "
        "attention kernel's saved value keeps all of qkv alive), and LoRAQKVLinear zero-pads its "
        "update into the fused width, against one LoRA dropout where peft has two. "
        f"The {gap / 1e6:,.0f} MB per sample left to the smaller published slope is outside the "
        "model code: Lightning Fabric's module wrapper "
        "converts the returned logit chunks to fp32 (`convert_output`; litgpt issue #1508), so "
        "the loop holds fp32 logits and their fp32 log-softmax, "
        f"{4 * SEQ * VOCAB / 1e6:,.0f} MB per sample more than 16-bit ones (4 bytes × {SEQ:,} "
        f"tokens × {VOCAB:,}): the held-out mapping models it (`fp32_outputs`).", ""])


def main() -> int:
    warnings.filterwarnings("ignore")
    try:
        sys.path.insert(0, str(fetch()))
    except (subprocess.CalledProcessError, StopIteration, OSError) as err:
        print(f"error: could not fetch {WHEEL} from the package registry ({err})\n"
              "hint: this benchmark needs the registry once; the wheel is cached in "
              "benchmarks/.cache", file=sys.stderr)
        return 2
    sys.meta_path.insert(0, _Stubs())
    sys.path.insert(0, str(HERE))  # heldout_mapping / heldout_models (trainfit's side)
    grid = [(layers, batch) for layers in (2, 3) for batch in (1, 2)]
    lit = {p: litgpt_point(*p) for p in grid}
    tf = {p: trainfit_point(*p) for p in grid}
    result = {"wheel": WHEEL, "seq_len": SEQ, "case": CASE.format("1/2/4"),
              "litgpt": slopes(lit), "trainfit": slopes(tf),
              "litgpt_points_bytes": {f"L{k[0]}xB{k[1]}": v for k, v in lit.items()},
              "trainfit_points_bytes": {f"L{k[0]}xB{k[1]}": v for k, v in tf.items()},
              "published_per_sample_bytes": published_per_sample()}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "litgpt_model_code.json").write_text(json.dumps(result, indent=1) + "\n")
    md = render(result)
    (RESULTS / "litgpt_model_code.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
