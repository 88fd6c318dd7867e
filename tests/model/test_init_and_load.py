"""A model built on meta gets what transformers would give it: its own initialisation (buffers
from the config, each architecture's scheme), and a checkpoint's weights in the layout
transformers converts on load (an audit: Gemma's embed_scale −0.01, Mixtral / Llama-3 rotary
frequencies at base 10,000, Mixtral's experts left random under a loaded checkpoint)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from trainfit.job import JobSpec
from trainfit.model.runtime import build_real
from trainfit.model.source import resolve_model

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "max_position_embeddings": 256, "head_dim": 16}


def _dir(tmp_path, name, cfg, save_weights=False):
    d = tmp_path / name
    if save_weights:
        torch.manual_seed(1)
        transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    else:
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg.to_dict()))
    return d


def _build(d):
    job = JobSpec(model=str(d), method="full", seq_len=32, micro_batch=2, effective_batch=2,
                  precision="fp32", grad_ckpt="off", attention="eager")
    return build_real(job, resolve_model(job.model), torch.device("cpu")).model


@pytest.mark.parametrize("kind, extra", [
    ("gemma3_text", {"rope_theta": 1e6, "sliding_window": 32}),
    ("llama", {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                   "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 64}}),
    ("mamba", {"num_hidden_layers": 2, "state_size": 4, "expand": 2}),
    # a review: integer and mask buffers (GPT-Neo's causal mask, all False, made attention a
    # blind average) were zeroed
    ("gpt_neo", {"num_layers": 2, "attention_types": [[["global", "local"], 1]],
                 "window_size": 16, "num_heads": 4}),
])
def test_a_random_init_is_transformers_own(tmp_path, kind, extra):
    cfg = transformers.AutoConfig.for_model(kind, **{**TINY, **extra})
    model = _build(_dir(tmp_path, kind, cfg))
    ref = transformers.AutoModelForCausalLM.from_config(cfg)
    mine = dict(model.named_buffers())
    for name, b in ref.named_buffers():  # computed from the config: equal, masks too
        assert torch.equal(mine[name], b) if not b.is_floating_point() else \
            torch.allclose(mine[name].float(), b.float()), name
    params = dict(model.named_parameters())
    for name, p in ref.named_parameters():  # drawn: the same scheme (the mean within noise)
        if "A_log" in name or name.endswith(".D") or "norm" in name:
            assert torch.allclose(params[name].float(), p.float()), name


def test_a_checkpoint_in_a_converted_layout_loads_as_from_pretrained(tmp_path):
    cfg = transformers.AutoConfig.for_model("mixtral", **{**TINY, "num_local_experts": 4,
                                                          "num_experts_per_tok": 2,
                                                          "rope_theta": 1e6})
    d = _dir(tmp_path, "mixtral", cfg, save_weights=True)
    model = _build(d)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d)
    mine = dict(model.named_parameters())
    for name, p in ref.named_parameters():
        assert torch.equal(mine[name], p), name
    # a stray key beside complete weights (an old checkpoint's inv_freq) loads as it is: no
    # second load through transformers (a review: it fired on any unmatched key)
    from safetensors.torch import load_file, save_file

    from trainfit.model import runtime

    calls = []
    real = runtime._load_converted
    runtime._load_converted = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        llama = _dir(tmp_path, "llama", transformers.AutoConfig.for_model("llama", **TINY),
                     save_weights=True)
        g = next(llama.glob("*.safetensors"))
        save_file({**load_file(str(g)), "model.layers.0.self_attn.rotary_emb.inv_freq":
                   torch.ones(8)}, str(g), metadata={"format": "pt"})
        _build(llama)
    finally:
        runtime._load_converted = real
    assert calls == []
    # the buffers no checkpoint stores (rope_theta 1e6's frequencies) are the config's, and
    # transformers' init of what was not loaded overwrote nothing that was
    bufs = dict(model.named_buffers())
    for name, b in ref.named_buffers():
        if b.is_floating_point():
            assert torch.allclose(bufs[name], b), name


def _job_build(d, **kw):
    kw = {"method": "full", "precision": "fp32", **kw}
    job = JobSpec(model=str(d), seq_len=32, micro_batch=2, effective_batch=2, grad_ckpt="off",
                  attention="eager", **kw)
    return build_real(job, resolve_model(job.model), torch.device("cpu"))


def _equal_to(wl, ref):
    from trainfit.model.init import hf_model

    mine = dict(hf_model(wl.model).named_parameters())
    return [n for n, p in ref.named_parameters()
            if not torch.equal(mine.get(n, mine.get(n.replace(".weight", ".base_layer.weight"))),
                               p.to(mine.get(n, p).dtype))]


def test_every_layout_of_a_checkpoint_loads_or_is_refused(tmp_path):
    """An audit: under --lm-head-chunk no weight loaded; a .bin checkpoint and a bare model's
    (GPT-2's h.0…) loaded nothing, silently; a sharded one without a shard loaded in part."""
    from safetensors.torch import save_file

    from trainfit.job import JobError

    cfg = transformers.AutoConfig.for_model("llama", **TINY)
    d = _dir(tmp_path, "llama", cfg, save_weights=True)
    ref = transformers.AutoModelForCausalLM.from_pretrained(d)
    assert _equal_to(_job_build(d, lm_head_chunk=64), ref) == []
    assert _equal_to(_job_build(d, method="lora", trl_logprob_head=True), ref) == []
    b = _dir(tmp_path, "bin", cfg)
    torch.save(ref.state_dict(), b / "pytorch_model.bin")  # read with weights_only=True
    assert _equal_to(_job_build(b), ref) == []
    # the bare model's names (no "transformer." prefix), as GPT2Model saves them
    g = transformers.AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=512,
                                          n_positions=256, bos_token_id=0, eos_token_id=0)
    bare = transformers.GPT2Model(g)
    gd = tmp_path / "gpt2"
    bare.save_pretrained(gd)
    (gd / "config.json").write_text(json.dumps({**g.to_dict(), "architectures": ["GPT2LMHeadModel"]}))
    wl = _job_build(gd)
    assert wl.load_note is None
    from trainfit.model.init import hf_model

    assert torch.equal(hf_model(wl.model).transformer.h[1].mlp.c_fc.weight, bare.h[1].mlp.c_fc.weight)
    # a checkpoint missing some weights: said, with the count
    part = _dir(tmp_path, "part", cfg)
    save_file({k: v for k, v in ref.state_dict().items() if "layers.1.mlp" not in k},
              str(part / "model.safetensors"))
    assert _job_build(part).load_note.startswith("weights: 18 of 21 parameter tensors loaded")
    # a Trainer's / accelerate's state beside the weights is not read as weights
    torch.save({"not": "weights"}, b / "training_args.bin")
    torch.save(torch.ones(3), b / "sampler.bin")
    assert _equal_to(_job_build(b), ref) == []
    # refused: a missing shard, weights of another model
    s = tmp_path / "sharded"
    ref.save_pretrained(s, max_shard_size="100KB")
    sorted(s.glob("*.safetensors"))[1].unlink()
    with pytest.raises(JobError, match="lists 1 shard"):
        _job_build(s)
    other = _dir(tmp_path, "other", cfg)
    save_file(bare.state_dict(), str(other / "model.safetensors"))
    with pytest.raises(JobError, match="matches the model's parameters"):
        _job_build(other)


def test_lora_b_padding_row_and_rotary_dtype_are_transformers_and_peft_own(tmp_path):
    """An audit: LoRA's B matrices were drawn N(0, 0.02) (peft starts them at 0: the adapter a
    no-op); a tied head's init overwrote the embedding's zero padding row; bf16 weights made the
    rotary frequencies bf16 (from_pretrained(dtype=bf16) keeps them fp32)."""
    cfg = transformers.AutoConfig.for_model("llama", **TINY, tie_word_embeddings=True,
                                            pad_token_id=0)
    d = _dir(tmp_path, "tied", cfg)
    wl = _job_build(d, method="lora", precision="bf16-true")
    lora_b = [p for n, p in wl.model.named_parameters() if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(p) == 0 for p in lora_b)
    lora_a = [p for n, p in wl.model.named_parameters() if "lora_A" in n]
    assert all(p.std() > 0.01 for p in lora_a)
    emb = wl.model.get_base_model().model.embed_tokens.weight
    assert torch.count_nonzero(emb[0]) == 0 and emb[1].abs().max() > 0
    # the same with the tied head itself adapted (its name then ends .base_layer.weight)
    head = _job_build(d, method="lora", precision="bf16-true", lora_targets=["q_proj", "lm_head"])
    assert torch.count_nonzero(head.model.get_base_model().model.embed_tokens.weight[0]) == 0
    # a tied checkpoint holding its own lm_head copy: the embedding's value is kept, as
    # from_pretrained keeps it (the head's, first in the file's order, won: a review)
    from safetensors.torch import save_file

    torch.manual_seed(3)
    sd = {k: v.clone() for k, v in transformers.AutoModelForCausalLM.from_config(cfg)
          .state_dict().items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"] + 1.0
    save_file(sd, str(d / "model.safetensors"))
    loaded = _job_build(d).model
    assert torch.equal(loaded.model.embed_tokens.weight, sd["model.embed_tokens.weight"])
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    buffers = dict(wl.model.get_base_model().named_buffers())
    assert buffers["model.rotary_emb.inv_freq"].dtype == torch.float32
    assert {p.dtype for p in wl.model.parameters()} == {torch.bfloat16}
