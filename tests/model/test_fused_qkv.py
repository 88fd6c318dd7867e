"""lit-gpt's fused q/k/v projection and its LoRA (trainfit.model.fused_qkv, ``--fused-qkv``)."""

import copy

import pytest
import torch

from trainfit.job import JobError, JobSpec
from trainfit.model.fused_qkv import fuse_qkv


def _peft_llama(kv_heads: int, targets: list[str]):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=100)
    model = get_peft_model(LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                             target_modules=targets))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: a non-zero update tests the fused B
            torch.nn.init.normal_(p)
    return model


@pytest.mark.parametrize(("kv_heads", "targets"), [(4, ["q_proj", "v_proj"]),
                                                   (2, ["q_proj", "k_proj", "v_proj"])])
def test_the_fused_projection_computes_what_the_three_did(kv_heads, targets):
    """lit-gpt's LoRAQKVLinear (grouped conv1d for equal widths, one conv per part for grouped
    queries; zero padding where a part is not adapted) is the same function as peft's LoRA on
    the separate projections, with the same parameters and gradients."""
    model = _peft_llama(kv_heads, targets)
    ref = copy.deepcopy(model)
    assert fuse_qkv(model, name="tiny", r=4, alpha=8, dropout=0.0,
                    lora_dtype=torch.float32) == 2
    ids = torch.randint(0, 100, (2, 16))
    loss, ref_loss = (m(input_ids=ids, labels=ids).loss for m in (model, ref))
    assert loss.item() == pytest.approx(ref_loss.item(), abs=1e-6)
    loss.backward()
    ref_loss.backward()
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == 4 and all(".qkv_proj.lora_" in n for n in trainable)
    fused = model.base_model.model.model.layers[0].self_attn.qkv_proj
    sep = ref.base_model.model.model.layers[0].self_attn
    grads = [getattr(sep, t).lora_A["default"].weight.grad for t in targets]
    torch.testing.assert_close(fused.lora_A.grad, torch.cat(grads))


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_what_the_attention_saves_is_lit_gpts(kv_heads):
    """Full fine-tuning (no LoRA terms), counted over the storages saved for backward.  Multi-head
    attention: the saved value heads are views of the fused output, so each layer holds 3 d per
    token where the separate projections hold d — exactly 2 d more.  Grouped queries: lit-gpt
    saves k and v expanded to every head (copies, d each) where transformers 5 hands the kernel
    the unrepeated ones (kv each) — exactly 2 (d − kv) more."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=100,
                      use_cache=False)  # a cache's concatenation would copy k and v (training
    ref = LlamaForCausalLM(cfg)  # runs without one: trainfit builds use_cache=False)
    model = copy.deepcopy(ref)
    fuse_qkv(model, name="tiny", r=4, alpha=8, dropout=0.0, lora_dtype=None)
    ids = torch.randint(0, 100, (2, 16))

    def saved_bytes(m: torch.nn.Module) -> int:
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                storages[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = m(input_ids=ids, labels=ids)
        assert out.loss.item() == pytest.approx(ref_loss, abs=1e-6)
        return sum(storages.values())

    ref_loss = ref(input_ids=ids, labels=ids).loss.item()
    tokens, d, fp32 = 2 * 16, 64, 4
    kv = d * kv_heads // 4
    extra = 2 * d if kv == d else 2 * (d - kv)
    assert saved_bytes(model) - saved_bytes(ref) == extra * tokens * cfg.num_hidden_layers * fp32


@pytest.mark.parametrize(("fixture", "why"), [
    ("tiny_t5", "seq2seq-lm model; lit-gpt's fused attention"),  # an encoder-decoder
    ("tiny_gpt2", "no attention with separate q_proj"),  # its attention is fused already
])
def test_models_the_fused_code_cannot_stand_for_are_refused(request, fixture, why):
    from trainfit.hardware.gpus import find_gpu
    from trainfit.memory.predict import predict_memory

    job = JobSpec(model="t", seq_len=32, micro_batch=1, fused_qkv=True)
    with pytest.raises(JobError, match=why) as err:
        predict_memory(job, request.getfixturevalue(fixture), find_gpu("a100-80gb"))
    assert "drop --fused-qkv" in err.value.hint


def test_simulated_lora_step_holds_more_with_the_fused_code(tiny_llama):
    """The simulation builds the fused stand-in (CPU target): same parameters, a higher peak."""
    from trainfit.memory.simulate import SimTarget, simulate_step

    base = dict(model="t", method="lora", lora_targets=["q", "v"], precision="bf16-true",
                seq_len=64, micro_batch=2, max_grad_norm=None)
    sep, fused = (simulate_step(JobSpec(**base, fused_qkv=f), tiny_llama, SimTarget(device="cpu"))
                  for f in (False, True))
    assert fused.breakdown["parameters"] == sep.breakdown["parameters"]
    assert fused.peak_allocated_bytes > sep.peak_allocated_bytes


def test_plan_says_it_simulated_the_fused_code(tiny_llama):
    from trainfit.hardware.gpus import find_gpu
    from trainfit.memory.predict import predict_memory

    job = JobSpec(model="t", method="lora", seq_len=64, micro_batch=2, fused_qkv=True)
    notes = predict_memory(job, tiny_llama, find_gpu("a100-80gb")).model_notes
    assert any(n.startswith("fused_qkv: q, k and v simulated as one projection") for n in notes)


def test_cross_attention_is_not_fused_and_mixed_biases_are_refused():
    """A cross-attention's q reads other states than its k and v (Mllama's layers in a causal
    LM); one fused projection of one input cannot stand for it."""

    class Attn(torch.nn.Module):
        def __init__(self, cross: bool, k_bias: bool = False) -> None:
            super().__init__()
            self.head_dim, self.is_cross_attention = 8, cross
            self.q_proj = torch.nn.Linear(16, 16, bias=False)
            self.k_proj = torch.nn.Linear(16, 16, bias=k_bias)
            self.v_proj = torch.nn.Linear(16, 16, bias=False)

    model = torch.nn.Sequential(Attn(False), Attn(True))
    assert fuse_qkv(model, name="m", r=4, alpha=8, dropout=0.0, lora_dtype=None) == 1
    assert hasattr(model[0], "qkv_proj") and not hasattr(model[1], "qkv_proj")
    with pytest.raises(JobError, match="differ in having a bias"):
        fuse_qkv(torch.nn.Sequential(Attn(False, k_bias=True)), name="m", r=4, alpha=8,
                 dropout=0.0, lora_dtype=None)
