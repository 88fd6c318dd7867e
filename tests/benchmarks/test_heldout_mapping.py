"""benchmarks/heldout_mapping.py: every held-out published case maps to a valid job (no simulation)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from trainfit.job import JobSpec

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def hm(load_bench) -> ModuleType:
    return load_bench("heldout_mapping")


@pytest.fixture(scope="module")
def mapped(hm: ModuleType) -> dict:
    cases = json.loads((BENCH / "data" / "heldout_memory.json").read_text())["cases"]
    return {c["id"]: (c, hm.map_case(c)) for c in cases}


def test_every_case_maps_to_a_valid_job(mapped: dict) -> None:
    assert len(mapped) == 95
    skipped = [k for k, (_, m) in mapped.items() if m.skip]
    # no sequence length published: not predicted (heldout_memory checks skip before any job)
    assert skipped == ["peft_docs_deepspeed_bart-large_lora_1gpu_zero3_offload"]
    for case, m in mapped.values():
        if m.skip:
            assert m.job.get("seq_len") is None
            continue
        job = JobSpec(**m.job)  # raises JobError on a mapping JobSpec refuses
        assert job.ranks == case["ranks"] and job.method == case["method"]
        assert m.compare in ("allocated", "reserved", "device")


def test_peaks_compared_like_with_like(mapped: dict) -> None:
    compare = {k: m.compare for k, (_, m) in mapped.items()}
    assert compare["torchtitan_perf_llama3.1-8b_8xh100_fsdp2"] == "reserved"
    assert compare["fsdp_qlora_bench_3090_llama2-7b_qlora_ctx512_bs1"] == "reserved"
    assert compare["litgpt_resource_tables_1xa100-40gb_llama-2-7b_lora_none_mb1"] == "allocated"
    assert compare["torchtune05_optflags_llama3.2-3b_a100_09_lora"] == "allocated"  # peak active
    assert compare["peft_docs_deepspeed_llama2-70b_lora_8xh100_zero3"] == "device"
    assert compare["litgpt_resource_tables_1xa100-40gb_llama-2-13b_lora_none_mb2"] == "device"  # OOM


def test_framework_quirks(mapped: dict) -> None:
    _, lit = mapped["litgpt_resource_tables_1xa100-40gb_llama-2-7b_lora_nf4_mb1"]
    assert lit.job["quant"] == "nf4" and lit.job["bnb_legacy"] and lit.job["quant_lm_head"]
    assert lit.job["lm_head_chunk"] == 128 and lit.job["hold_outputs"]
    assert lit.job["fp32_outputs"]  # Fabric converts the returned chunks to fp32
    _, dq = mapped["litgpt_resource_tables_1xa100-40gb_llama-2-7b_lora_nf4-dq_mb1"]
    assert dq.job["quant"] == "nf4-dq"
    _, tt = mapped["torchtune05_optflags_llama3.2-3b_a100_04_chunked_ce"]
    assert tt.job["lm_head_chunk"] == 4096 // 8 and tt.job["precision"] == "bf16-true"
    _, plain = mapped["torchtune05_optflags_llama3.2-3b_a100_03_compile"]
    assert "lm_head_chunk" not in plain.job
    _, blog = mapped["hf_blog_pytorch_fsdp_gpt2-xl_ddp_fp32_1gpu_bs1_oom"]
    assert blog.job["grads_to_none"] is False and blog.eager_modules
    assert blog.gpu_overrides["memory_bytes"] == int(23.65 * 2**30)


def test_missing_fields_make_a_case_unsupported(hm: ModuleType, mapped: dict) -> None:
    fields = set(JobSpec.__dataclass_fields__)
    for feature, case_id in (
            ("cpu-offload", "fsdp_qlora_bench_3090_llama2-70b_qlora_cpuoffload_ctx2048_bs2"),
            ("optimizer-in-backward", "torchtune05_optflags_llama3.2-3b_a100_06_opt_in_bwd"),
            ("activation-offload", "torchtune05_optflags_llama3.2-3b_a100_09_lora")):
        _, m = mapped[case_id]
        has_field = any(f in fields for f, _ in hm.FEATURE_FIELDS[feature])
        assert (feature in m.unsupported) is not has_field
        field, value = next(((f, v) for f, v in hm.FEATURE_FIELDS[feature] if f in fields),
                            (None, None))
        assert field is None or m.job[field] == value
    _, ok = mapped["fsdp_qlora_bench_3090_llama2-7b_qlora_ctx512_bs1"]
    assert ok.unsupported == [] and ok.job["sharding"] == "fsdp"
    _, bart = mapped["peft_docs_deepspeed_bart-large_lora_1gpu_zero3_offload"]
    assert bart.skip  # no sequence length published: nothing to predict


def test_loops_that_keep_the_output_through_backward(mapped: dict) -> None:
    """Which sources' loops still reference the model output during the backward pass: the
    hand-written loops (Answer.AI's train.py, run_clm_no_trainer, a custom accelerate loop) and
    torchtune 0.1 (``del logits`` came in 0.2); HF Trainer, torchtune ≥ 0.2 and torchtitan
    release it first; litgpt holds it longer (hold_outputs)."""
    kept = {cid for cid, (_, m) in mapped.items() if m.job.get("output_in_backward")}
    by_prefix = {p: {cid for cid in mapped if cid.startswith(p)} for p in (
        "fsdp_qlora_", "hf_blog_", "torchtune011_", "torchtune03_", "torchtune05_",
        "torchtitan_", "peft_docs_fsdp", "peft_docs_deepspeed_llama", "litgpt_")}
    for p in ("fsdp_qlora_", "hf_blog_", "torchtune011_"):
        assert by_prefix[p] and by_prefix[p] <= kept, p
    for p in ("torchtune03_", "torchtune05_", "torchtitan_", "peft_docs_fsdp",
              "peft_docs_deepspeed_llama", "litgpt_"):
        assert by_prefix[p] and not by_prefix[p] & kept, p
    assert "peft_docs_deepspeed_bart-large_lora_1gpu_zero3_offload" in kept  # custom loop
    assert all(m.job.get("hold_outputs") for cid, (_, m) in mapped.items()
               if cid.startswith("litgpt_"))


def test_torchtune_builds_from_copies_where_its_builder_does(mapped: dict) -> None:
    """Llama-2's builder deep-copies one layer (0.1.1 … 0.5.0 wheels), on the GPU in the
    single-device recipes; Llama-3.1's builds a list from 0.3.1, Llama-3.2's in 0.5.0; the
    distributed recipes build on meta."""
    clones = {k: m.job.get("clone_layers", False) for k, (_, m) in mapped.items()}
    assert clones["torchtune011_readme_llama2-7b_lora_1x4090"]
    assert clones["torchtune01_tutorial_llama2-7b_qlora_1dev"]
    assert not clones["torchtune011_readme_llama2-7b_lora_2x4090_fsdp"]
    assert not clones["torchtune03_readme_llama3.1-8b_lora_1x4090"]
    assert not clones["torchtune05_optflags_llama3.2-3b_a100_09_lora"]
