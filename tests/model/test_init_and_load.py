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
