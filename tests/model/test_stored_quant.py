"""A checkpoint published 4-bit (bitsandbytes ``quantization_config`` in its config.json): loaded
as stored, LoRA on it is QLoRA, and the layers the simulation makes 4-bit are the ones
transformers' own quantizer converts for it (checked against its ``preprocess_model``)."""

import json

import pytest
import torch

from trainfit.job import JobError, JobSpec
from trainfit.model.experts import stacked_expert_params_of, stacked_when_stored_params_of
from trainfit.model.source import resolve_model
from trainfit.model.standins import Linear4bitSim
from trainfit.model.stored_quant import hf_module_name, job_for_checkpoint, stored_quant
from trainfit.model.workload import build_model_on_meta
from trainfit.render.words import experts_note

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 256, "max_position_embeddings": 128}
TINY_LLAMA4 = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 128,
               "intermediate_size_mlp": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
               "num_local_experts": 4, "num_experts_per_tok": 1,
               "max_position_embeddings": 128}


def _bnb(quant_type="nf4", double=True, skip=None, bits=4):
    return {"quant_method": "bitsandbytes", "load_in_4bit": bits == 4, "load_in_8bit": bits == 8,
            "_load_in_4bit": bits == 4, "_load_in_8bit": bits == 8,
            "bnb_4bit_quant_type": quant_type, "bnb_4bit_use_double_quant": double,
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
            "llm_int8_skip_modules": skip}


def _checkpoint(tmp_path, config, quantization=None):
    data = dict(config)
    if quantization is not None:
        data["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(data))
    return resolve_model(str(tmp_path))


def _transformers_4bit(source, pre_quantized, skip=None):
    """Names of the layers transformers' bitsandbytes quantizer makes ``Linear4bit`` (its own
    ``preprocess_model`` on a meta build: the modules it replaces before the weights load)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer

    qc = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                            bnb_4bit_use_double_quant=True, llm_int8_skip_modules=skip)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(source.config)
    AutoHfQuantizer.from_config(qc, pre_quantized=pre_quantized).preprocess_model(
        model, device_map={"": "cpu"})
    return sorted(n for n, m in model.named_modules() if type(m).__name__ == "Linear4bit")


def _simulated_4bit(job, source):
    model, _ = build_model_on_meta(job, source)
    return sorted(hf_module_name(n) for n, m in model.named_modules()
                  if isinstance(m, Linear4bitSim))


def test_the_checkpoints_format_is_read_from_its_quantization_config():
    class Cfg:
        quantization_config = _bnb()

    assert stored_quant(Cfg, "m").quant == "nf4-dq" and stored_quant(Cfg, "m").skip_modules is None
    Cfg.quantization_config = _bnb("nf4", double=False, skip=["lm_head", "vision_tower"])
    got = stored_quant(Cfg, "m")
    assert (got.quant, got.skip_modules) == ("nf4", ("lm_head", "vision_tower"))
    Cfg.quantization_config = _bnb("fp4", double=False)
    assert stored_quant(Cfg, "m").quant == "fp4"
    Cfg.quantization_config = {"quant_method": "mxfp4"}  # gpt-oss: dequantized to fine-tune
    assert stored_quant(Cfg, "m") is None
    Cfg.quantization_config = _bnb(bits=8)
    with pytest.raises(JobError, match="stored 8-bit"):
        stored_quant(Cfg, "m")
    # fp4 with double-quantized scales: planned as fp4 (its fp32 scales, the safe side), as the
    # script front door maps it
    Cfg.quantization_config = _bnb("fp4", double=True)
    assert stored_quant(Cfg, "m").quant == "fp4"


def test_lora_on_a_4bit_checkpoint_is_qlora_and_full_fine_tuning_is_refused(tmp_path):
    src = _checkpoint(tmp_path, TINY_LLAMA, _bnb("nf4", double=False))
    assert "loads the weights 4-bit, as stored" in src.note
    said = []
    job = job_for_checkpoint(JobSpec(model=str(tmp_path), seq_len=32, method="lora"), src,
                             {"method": "lora"}, said.append)
    assert (job.method, job.quant) == ("qlora", "nf4")
    assert said == ["model: --method lora on a checkpoint stored 4-bit is QLoRA: planned as "
                    "--method qlora --quant nf4"]
    said.clear()
    job = job_for_checkpoint(JobSpec(model=str(tmp_path), seq_len=32, method="qlora",
                                     quant="nf4-dq"), src, {"quant": "nf4-dq"}, said.append)
    assert job.quant == "nf4" and "the checkpoint's weights are nf4, as stored" in said[0]
    with pytest.raises(JobError, match="4-bit weights take no gradient"):
        job_for_checkpoint(JobSpec(model=str(tmp_path), seq_len=32, method="full"), src, {})
    # the simulation's own guard: a job that is not what from_pretrained makes of it
    with pytest.raises(JobError, match="loads as they are") as err:
        build_model_on_meta(JobSpec(model=str(tmp_path), seq_len=32, method="lora"), src)
    assert err.value.hint == "use --method qlora --quant nf4"


@pytest.mark.parametrize("skip", [None, ["lm_head", "layers.1.mlp", "model.layers.0.mlp"]])
def test_the_4bit_layers_are_transformers_own_for_a_stored_checkpoint(tmp_path, skip):
    """Without a skip list transformers keeps its default skips (the head); with one, only those
    (matched as its ``should_convert_module`` does: ``layers.1.mlp`` matches nothing, the full
    ``model.layers.0.mlp`` keeps that MLP 16-bit) and no default ones."""
    src = _checkpoint(tmp_path, TINY_LLAMA, _bnb(skip=skip))
    job = JobSpec(model=str(tmp_path), seq_len=32, method="qlora", lora_targets=["q", "v"])
    want = _transformers_4bit(src, pre_quantized=True, skip=skip)
    assert _simulated_4bit(job, src) == want
    assert ("lm_head" in want) == (skip is not None and "lm_head" not in skip)
    if skip is not None:
        assert "model.layers.0.mlp.up_proj" not in want
        assert "model.layers.1.mlp.up_proj" in want


def test_llama4s_experts_are_4bit_only_from_a_stored_checkpoint(tmp_path):
    """transformers unstacks Llama-4's experts into nn.Linear layers (then 4-bit) only when the
    checkpoint is pre-quantized; quantized on the fly they stay stacked 16-bit, and the plan's
    note counts them (it had left Llama-4's out)."""
    on_the_fly = _checkpoint(tmp_path, TINY_LLAMA4)
    job = JobSpec(model=str(tmp_path), seq_len=32, method="qlora", lora_targets=["q", "v"],
                  precision="bf16-true")
    assert _simulated_4bit(job, on_the_fly) == _transformers_4bit(on_the_fly, False)
    experts = 2 * 4 * (64 * 2 * 128 + 128 * 64)  # layers × experts × (gate_up + down)
    assert stacked_expert_params_of(on_the_fly) == experts
    # the plan's note names the way out: a checkpoint stored 4-bit has none of them 16-bit
    assert stacked_when_stored_params_of(on_the_fly) == 0
    note = experts_note(experts, 10**9, False, if_stored=True)
    assert "a checkpoint published 4-bit" in note and "sharding over several GPUs" in note

    stored_dir = tmp_path / "stored"
    stored_dir.mkdir()
    stored = _checkpoint(stored_dir, TINY_LLAMA4, _bnb())
    job = job.replace(model=str(stored_dir))
    simulated = _simulated_4bit(job, stored)
    assert simulated == _transformers_4bit(stored, True)
    assert sum(".experts." in n for n in simulated) == 2 * 4 * 3
    assert stacked_expert_params_of(stored) == 0
    # the same parameters, unstacked
    model, _ = build_model_on_meta(job, stored)
    fly, _ = build_model_on_meta(job.replace(model=str(tmp_path)), on_the_fly)

    def weights(m):
        return sum(b.numel() * b.element_size() for n, b in m.named_buffers()
                   if n.endswith("weight_packed")) + sum(
            p.numel() * p.element_size() for p in m.parameters() if not p.requires_grad)

    # the experts' 16-bit bytes become packed 4-bit bytes: a quarter
    assert weights(fly) - weights(model) == experts * 2 - experts // 2


def test_plan_of_a_stored_checkpoint_with_method_full_is_one_clear_line(tmp_path):
    from typer.testing import CliRunner

    from trainfit.cli.main import app

    _checkpoint(tmp_path, TINY_LLAMA, _bnb())
    r = CliRunner().invoke(app, ["plan", str(tmp_path), "--gpu", "t4", "--method", "full",
                                 "--seq-len", "32"])
    assert r.exit_code == 2
    assert "4-bit weights take no gradient" in r.output and "hint: use --method qlora" in r.output


def test_a_stored_checkpoint_loads_without_the_quantizers_transients(tmp_path):
    """The same QLoRA step from a 16-bit checkpoint quantized on load and from one stored 4-bit:
    equal allocated peaks (the same 4-bit model), and the stored one's loading reserve holds no
    16-bit copy of a weight (bitsandbytes' from_prequantized moves the packed bytes)."""
    from trainfit.hardware.gpus import find_gpu
    from trainfit.memory.predict import predict_memory

    wide = {**TINY_LLAMA, "hidden_size": 512, "intermediate_size": 2048}
    fly = _checkpoint(tmp_path, wide)
    (tmp_path / "s").mkdir()
    stored = _checkpoint(tmp_path / "s", wide, _bnb())
    job = JobSpec(model="m", seq_len=64, micro_batch=2, method="qlora", precision="bf16-true")
    gpu = find_gpu("t4")
    a, b = predict_memory(job, fly, gpu), predict_memory(job, stored, gpu)
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert b.reserved_before_step_bytes < a.reserved_before_step_bytes
    # the largest weight's 16-bit copy (the MLP's, 2 MiB) is what quantizing on load keeps cached
    assert a.reserved_before_step_bytes - b.reserved_before_step_bytes >= 512 * 2048 * 2
    assert any("loaded as stored" in n for n in b.model_notes)


def test_sharded_loading_of_a_stored_checkpoint_has_no_16bit_weight_in_flight(tmp_path):
    """transformers 5 materialises a quantized model whole on every rank before FSDP shards it;
    quantizing on load adds the 16-bit weight being quantized (the MLP's), a stored checkpoint
    arrives packed."""
    from trainfit.memory.loading import loading_peak_bytes

    fly = _checkpoint(tmp_path, TINY_LLAMA)
    (tmp_path / "s").mkdir()
    stored = _checkpoint(tmp_path / "s", TINY_LLAMA, _bnb())
    job = JobSpec(model="m", seq_len=32, method="qlora", ranks=2, sharding="fsdp")
    terms = {"parameters": 10_000}  # a rank's shard: not what loading holds
    assert loading_peak_bytes(job, fly, terms, 1_000) - loading_peak_bytes(
        job, stored, terms, 1_000) == 64 * 128 * 2
    # the whole model on each rank: the 7 projections of each of 2 layers packed (½ B), the
    # embedding, the head and the norms 16-bit (2 B), and the quantization state
    linears = 2 * (64 * 64 * 2 + 64 * 32 * 2 + 64 * 128 * 3)
    others = 2 * 256 * 64 + (2 * 2 + 1) * 64
    assert loading_peak_bytes(job, stored, terms, 1_000) == linears // 2 + others * 2 + 1_000
    # --quant-lm-head: the head (256 × 64) is packed too
    head = job.replace(quant_lm_head=True)
    assert loading_peak_bytes(job, stored, terms, 1_000) - loading_peak_bytes(
        head, stored, terms, 1_000) == 256 * 64 * 2 - 256 * 64 // 2
    # a head tied to the embedding is the embedding: 16-bit all the same (a review)
    from transformers import LlamaConfig

    from trainfit.memory.loading import packed_4bit_model_bytes
    from trainfit.model.source import ModelSource

    tied = ModelSource("t", LlamaConfig(**{**TINY_LLAMA, "tie_word_embeddings": True}),
                       "causal-lm", "local")
    assert packed_4bit_model_bytes(tied, True) == packed_4bit_model_bytes(tied, False)


def test_a_tied_head_stays_16bit_whatever_the_skip_list_says(tmp_path):
    """transformers' preprocess_model makes a tied head Linear4bit when the stated skip list
    lacks it, but tie_weights() after loading puts the 16-bit embedding back into it."""
    src = _checkpoint(tmp_path, {**TINY_LLAMA, "tie_word_embeddings": True},
                      _bnb(skip=["model.layers.0.mlp"]))
    job = JobSpec(model=str(tmp_path), seq_len=32, method="qlora", lora_targets=["q", "v"])
    assert "lm_head" in _transformers_4bit(src, True, skip=["model.layers.0.mlp"])
    simulated = _simulated_4bit(job, src)
    assert "lm_head" not in simulated and "model.layers.1.mlp.up_proj" in simulated


def test_a_packed_weight_stored_as_a_parameter_is_counted_once_in_mfus_n():
    """Sharded QLoRA keeps the packed bytes as a bf16 parameter: counted beside in × out, N
    was 1.25 × too large on every FSDP-QLoRA row."""
    from trainfit.model.workload import matmul_params

    for storage in (torch.uint8, torch.bfloat16):
        layer = Linear4bitSim(1024, 512, True, torch.bfloat16, True, quant_storage=storage)
        assert matmul_params(layer) == 1024 * 512


def test_a_real_run_of_a_stored_checkpoint_is_one_clear_refusal(tmp_path):
    from trainfit.model.runtime import build_real

    src = _checkpoint(tmp_path, TINY_LLAMA, _bnb())
    job = JobSpec(model=str(tmp_path), seq_len=32, method="qlora", quant="nf4-dq")
    with pytest.raises(JobError, match=r"stored 4-bit .* real 4-bit runs are not wired") as err:
        build_real(job, src, torch.device("cpu"), init="random")
    assert "16-bit original" in err.value.hint
