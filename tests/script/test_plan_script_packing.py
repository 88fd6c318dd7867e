"""A packing SFT script (TRL's bfd bins): read as padding-free, planned as the job file with
``padding_free: true`` plans it — one packed row per micro-batch and its mask."""

from __future__ import annotations

import json

from plan_json import job_file, peak_rows, plan_json


def test_a_packing_sft_script_plans_its_packed_row_as_the_job_file_does(seed001, tmp_path):
    """SFTConfig(packing=True): TRL's bfd packing hands the model one row per micro-batch with
    position_ids; read so, the job is padding-free, and the plan equals the job file's with
    padding_free: true — one row of 2 × 128 positions and its mask (was: separate rows, the
    mask said but not planned)."""
    flags = ["--gpu", "rtx-3060", "--precision", "bf16-true", "--grad-ckpt", "off"]
    args = json.dumps({"packing": True, "per_device_train_batch_size": 2,
                       "gradient_accumulation_steps": 4, "gradient_checkpointing": False})
    got = plan_json([*flags, "--", *seed001.cmd("--no-4bit", "--args-json", args)])
    f = got["job"]
    assert f["padding_free"] is True and (f["micro_batch"], f["seq_len"]) == (2, 128)
    job = job_file(tmp_path, {
        "model": str(seed001.model), "method": "lora", "lora_r": 8, "lora_alpha": 16,
        "lora_dropout": 0.05, "lora_targets": ["k_proj", "o_proj", "q_proj", "v_proj"],
        "seq_len": 128, "effective_batch": 8, "trl_logprob_head": True, "padding_free": True,
        "base_dtype": "bf16", "optimizer_impl": "fused",  # --no-4bit: a bf16 base; trl's AdamW
        "packing": True},  # bfd bins of several documents: the mask at micro-batch 1 too
        {"micro_batch": 2, "grad_accum": 4, "grad_ckpt": "off"})
    want = plan_json([job, *flags])
    # the job file's current row is simulated whole (the script's as-read one is amp-bf16 over
    # its bf16 weights, another step): its reserve is the interpolated one's less
    g, w = peak_rows(got["plan"]), peak_rows(want)
    assert {k: v[0] for k, v in g.items()} == {k: v[0] for k, v in w.items()}
    assert {k: v for k, v in g.items() if k[2] != 2} == {k: v for k, v in w.items() if k[2] != 2}
    # what the packed row holds over separate rows: tests/plan/test_plan.py (padding_free)
