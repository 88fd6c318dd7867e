"""Which linear layers a 4-bit (QLoRA) build quantizes: the ones the user's stack converts."""

import torch

from trainfit.job import JobSpec
from trainfit.memory.simulate import simulate_step
from trainfit.model.source import ModelSource
from trainfit.model.standins import Linear4bitSim
from trainfit.model.workload import build_model_on_meta


def _source(config, task="causal-lm"):
    return ModelSource("tiny", config, task, "local")


def _quantized(model):
    """Leaf names of the 4-bit layers (a LoRA-wrapped one by the name of its wrapper)."""
    return sorted({n.removesuffix(".base_layer").split(".")[-1]
                   for n, m in model.named_modules() if isinstance(m, Linear4bitSim)})


def test_falcons_linear_subclass_stays_16_bit_under_transformers_but_not_fabric():
    """transformers 5 converts ``type(m) is nn.Linear`` only (FalconLinear stays bf16);
    Lightning Fabric's BitsandbytesPrecision (quant_from_fp16) converts every subclass too."""
    from transformers import FalconConfig

    src = _source(FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                               vocab_size=256))
    hf, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora"), src)
    fabric, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora",
                                            quant_from_fp16=True), src)
    assert _quantized(hf) == []
    assert _quantized(fabric) == ["dense", "dense_4h_to_h", "dense_h_to_4h", "query_key_value"]


def test_the_plan_says_which_linear_subclasses_stay_16_bit():
    """The kept FalconLinear layers are stated with their parameter count (the plan's weights are
    mostly 16-bit: a user expecting 4-bit weights learns why), not under Fabric's conversion."""
    from transformers import FalconConfig

    from trainfit.model.standins import linear_subclass_params_of
    from trainfit.plan.context import plan_assumptions
    from trainfit.render.words import linear_subclass_note

    src = _source(FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
                               vocab_size=256))
    # per layer: query_key_value 64 × (64 + 2·16) (multi-query), dense 64 × 64, the MLP 2 × 64 × 256
    per_layer = 64 * 96 + 64 * 64 + 2 * 64 * 256
    assert linear_subclass_params_of(src) == {"FalconLinear": 2 * per_layer}
    qlora = plan_assumptions(JobSpec(model="t", seq_len=32, method="qlora"), {}, source=src)
    assert qlora.linear_subclasses_16bit_params == {"FalconLinear": 2 * per_layer}
    for job in (JobSpec(model="t", seq_len=32, method="lora"),
                JobSpec(model="t", seq_len=32, method="qlora", quant_from_fp16=True)):
        assert plan_assumptions(job, {}, source=src).linear_subclasses_16bit_params == {}
    # falcon-7b's count: 6.63 B parameters of 6.92 B, 2 bytes each
    note = linear_subclass_note({"FalconLinear": 6_625_951_744}, 6_921_720_704)
    assert "FalconLinear layers subclass it, so 6.63 B of its 6.92 B" in note
    assert "(12.34 GiB in bf16)" in note


def test_t5_keeps_its_fp32_module_unquantized_and_simulates():
    """transformers' quantizer skips a model's _keep_in_fp32_modules (T5's ``wo``): quantized,
    T5's feed-forward cast its activations to the packed weight's uint8 and dropout failed."""
    from transformers import T5Config

    src = _source(T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16,
                           vocab_size=256), "seq2seq-lm")
    job = JobSpec(model="t", seq_len=32, micro_batch=2, method="qlora", precision="bf16-true")
    model, _ = build_model_on_meta(job, src)
    assert "wo" not in _quantized(model) and "wi" in _quantized(model)
    assert simulate_step(job, src).peak_allocated_bytes > 0


def test_llama4s_router_keeps_its_own_forward():
    from transformers import Llama4TextConfig

    cfg = Llama4TextConfig(hidden_size=64, intermediate_size=128, intermediate_size_mlp=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, vocab_size=256, num_local_experts=4,
                           num_experts_per_tok=1)
    model, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora"), _source(cfg))
    routers = [m for n, m in model.named_modules() if n.endswith("router")]
    assert routers and not any(isinstance(r, Linear4bitSim) for r in routers)
    assert torch.get_default_device().type == "cpu"


def test_an_fp32_qlora_job_computes_in_a_dtype_its_card_has():
    """An audit: fp32 QLoRA rows for a T4 (no bf16) were simulated with bf16 4-bit matmuls, and
    their speed read unknown for a dtype the card cannot run. There they compute in fp32
    (bitsandbytes' default); on a bf16 card in bf16, the pairing QLoRA recipes use."""
    import torch

    from trainfit.job import JobSpec
    from trainfit.model.workload import qlora_compute_dtype

    job = JobSpec(model="gpt2", method="qlora", quant="nf4", precision="fp32")
    assert qlora_compute_dtype(job, bf16=False) is torch.float32
    assert qlora_compute_dtype(job, bf16=True) is torch.bfloat16
    assert qlora_compute_dtype(job.replace(precision="amp-fp16"), bf16=True) is torch.float16
    assert qlora_compute_dtype(job.replace(precision="amp-bf16"), bf16=False) is torch.bfloat16


def test_gpt2s_conv1d_layers_are_4_bit_as_transformers_converts_them():
    """transformers 5 converts GPT-2's Conv1D (weight in × out) to Linear4bit too
    (replace_with_bnb_linear: ``isinstance(module, Conv1D)``); an audit found GPT-2 QLoRA planned
    exactly as its LoRA, every weight 16-bit.  The same layers with the same features as
    transformers' own conversion of the meta model; Fabric's stack keeps them."""
    import transformers
    from transformers import BitsAndBytesConfig, GPT2Config
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64)
    src = _source(cfg)
    ours, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora",
                                          lora_targets=["c_attn"]), src)
    with torch.device("meta"):
        theirs = transformers.GPT2LMHeadModel(cfg)
    replace_with_bnb_linear(theirs, quantization_config=BitsAndBytesConfig(load_in_4bit=True))

    def features(model, cls):
        return {n.removesuffix(".base_layer"): (m.in_features, m.out_features)
                for n, m in model.named_modules() if isinstance(m, cls)}

    import bitsandbytes as bnb

    want = {n.removeprefix("transformer."): f for n, f in features(theirs, bnb.nn.Linear4bit).items()
            if n != "lm_head"}
    got = {n.split("model.transformer.", 1)[-1]: f
           for n, f in features(ours, Linear4bitSim).items()}
    assert got == want and len(got) == 2 * 4  # c_attn, attn.c_proj, c_fc, mlp.c_proj per layer
    assert got["h.0.attn.c_attn"] == (64, 192)
    fabric, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora",
                                            lora_targets=["c_attn"], quant_from_fp16=True), src)
    assert _quantized(fabric) == []


def test_the_strict_fp32_list_is_quantized_as_transformers_quantizer_does(monkeypatch):
    """transformers' bnb quantizer skips ``model._keep_in_fp32_modules`` and not the
    ``_keep_in_fp32_modules_strict`` list (quantizer_bnb_4bit.py: get_modules_to_not_convert):
    a linear layer named only on the strict list is converted to 4-bit.  trainfit had skipped
    both, planning such a layer 16-bit."""
    from transformers import BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    monkeypatch.setattr(LlamaForCausalLM, "_keep_in_fp32_modules_strict", ["down_proj"])
    monkeypatch.setattr(LlamaForCausalLM, "_keep_in_fp32_modules", ["up_proj"])
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    with torch.device("meta"):
        theirs = LlamaForCausalLM(cfg)
    quantizer = Bnb4BitHfQuantizer(BitsAndBytesConfig(load_in_4bit=True))
    kept = quantizer.get_modules_to_not_convert(
        theirs, None, theirs._keep_in_fp32_modules)
    assert "up_proj" in kept and "down_proj" not in kept
    ours, _ = build_model_on_meta(JobSpec(model="t", seq_len=32, method="qlora"), _source(cfg))
    assert "down_proj" in _quantized(ours) and "up_proj" not in _quantized(ours)
