"""Where a model comes from: what its config.json says that the plan does not do."""


def test_a_checkpoint_stored_quantized_is_said_to_be_planned_unquantized(tiny_config_json):
    """gpt-oss publishes MXFP4 weights (``quantization_config``): ``from_config`` builds the
    model unquantized, as fine-tuning loads it dequantized; the plan says so."""
    import json

    from trainfit.model.source import resolve_model

    assert "quantization_config" not in resolve_model(str(tiny_config_json)).note
    data = json.loads(tiny_config_json.read_text())
    tiny_config_json.write_text(json.dumps({**data, "quantization_config": {
        "quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]}}))
    note = resolve_model(str(tiny_config_json)).note
    assert "quantization_config (mxfp4)" in note and "unquantized" in note
    assert note.startswith("not in config.json, transformers' defaults used: head_dim")


def _gemma3_json(tmp_path):
    """Gemma-3-4B's config.json as published, at test size: a language model in text_config (its
    heads and vocabulary left to Gemma3TextConfig's defaults) beside a SigLIP vision tower."""
    import json

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"hidden_size": 256, "intermediate_size": 512, "model_type": "gemma3_text",
                        "num_hidden_layers": 4},
        "vision_config": {"hidden_size": 64, "image_size": 224, "intermediate_size": 128,
                          "model_type": "siglip_vision_model", "num_attention_heads": 4,
                          "num_hidden_layers": 2, "patch_size": 14}}))
    return p


def test_a_multimodal_config_plans_what_auto_model_for_causal_lm_builds(tmp_path):
    """Gemma-3-4B's published config.json was refused ("does not state num_attention_heads,
    vocab_size"), then refused as multimodal.  AutoModelForCausalLM builds it as
    Gemma3ForConditionalGeneration, the tower held: that is what is planned, the sizes read
    from text_config, the defaults transformers fills in (the published model's) named."""
    from transformers import Gemma3Config, Gemma3TextConfig

    from trainfit.model.source import build_config, resolve_model

    src = resolve_model(str(_gemma3_json(tmp_path)))
    assert type(src.config) is Gemma3TextConfig and src.config.hidden_size == 256
    assert type(src.composite) is Gemma3Config and build_config(src) is src.composite
    assert src.composite.text_config is src.config
    assert src.task == "causal-lm"
    assert src.note.startswith("Gemma3ForConditionalGeneration, as AutoModelForCausalLM builds it")
    assert "siglip_vision_model: num_hidden_layers 2, hidden_size 64, intermediate_size 128" \
        in src.note and "not run" in src.note
    assert "text_config.num_attention_heads = 8" in src.note
    assert "text_config.vocab_size = 262208" in src.note


def test_a_multimodal_config_auto_model_for_causal_lm_builds_alone_is_its_language_model(
        tmp_path):
    """Llama-4 (and Qwen3.5, Llama-3.2-Vision): AutoModelForCausalLM builds the language model
    alone and loads only its weights; said so."""
    import json

    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
        "text_config": {"hidden_size": 128, "intermediate_size": 256, "intermediate_size_mlp": 256,
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
                        "num_local_experts": 4, "model_type": "llama4_text"},
        "vision_config": {"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
                          "model_type": "llama4_vision_model"}}))
    src = resolve_model(str(p))
    assert src.config.hidden_size == 128 and src.composite is not None
    assert src.note.startswith("Llama4ForConditionalGeneration's language model, as "
                               "AutoModelForCausalLM builds and loads it (Llama4ForCausalLM")
    assert "is not loaded" in src.note


def test_a_multimodal_config_auto_model_for_causal_lm_cannot_load_is_one_clear_line(tmp_path):
    """LLaVA, Qwen2-VL, Mistral-3: AutoModelForCausalLM has no class for them.  Refused, with the
    text model's full sizes in the hint, the tower's in the error."""
    import json

    import pytest

    from trainfit.job import JobError
    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "text_config": {"hidden_size": 256, "intermediate_size": 512, "model_type": "llama",
                        "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 1000},
        "vision_config": {"hidden_size": 64, "image_size": 224, "intermediate_size": 128,
                          "model_type": "clip_vision_model", "num_attention_heads": 4,
                          "num_hidden_layers": 2, "patch_size": 14}}))
    with pytest.raises(JobError) as err:
        resolve_model(str(p))
    assert "LlavaForConditionalGeneration is a multimodal model" in str(err.value)
    assert "AutoModelForCausalLM cannot load" in str(err.value)
    assert "clip_vision_model: num_hidden_layers 2, hidden_size 64, intermediate_size 128" \
        in str(err.value)
    hint = err.value.hint
    assert "hidden_size: 256" in hint and "model_type: llama" in hint


def test_the_hint_for_qwen2_vl_names_a_type_plan_takes_and_the_tied_head(tmp_path):
    """An audit: the hint said model_type: qwen2_vl_text, which plan then refused (no causal-LM
    class), and left tie_word_embeddings out (Qwen2-VL-2B ties its head). The hint now names
    qwen2 and the tie, and the config written from it plans."""
    import json
    import re

    import pytest

    from trainfit.job import JobError
    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
        "tie_word_embeddings": True,
        "text_config": {"hidden_size": 128, "intermediate_size": 256, "model_type": "qwen2_vl_text",
                        "num_hidden_layers": 2, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 1000},
        "vision_config": {"depth": 2, "embed_dim": 64, "hidden_size": 128, "num_heads": 4}}))
    with pytest.raises(JobError) as err:
        resolve_model(str(p))
    hint = err.value.hint
    assert "model_type: qwen2," in hint and "tie_word_embeddings: true" in hint
    fields = re.search(r"\(([^)]*)\)", hint).group(1)
    own = {}
    for kv in fields.split(", "):
        k, v = kv.split(": ")
        own[k] = json.loads(v) if v[0].isdigit() or v in ("true", "false") else v
    q = tmp_path / "text" / "config.json"
    q.parent.mkdir()
    q.write_text(json.dumps(own))
    src = resolve_model(str(q))
    assert src.config.model_type == "qwen2" and src.config.tie_word_embeddings is True


def test_a_multimodal_text_config_must_state_its_width_and_depth(tmp_path):
    """Its heads and vocabulary may be left to the class's defaults (the published Gemma-3-4B
    file does), its width and depth not: a text_config of only a model_type is refused."""
    import json

    import pytest

    from trainfit.job import JobError
    from trainfit.model.source import resolve_model

    p = _gemma3_json(tmp_path)
    data = json.loads(p.read_text())
    del data["text_config"]["num_hidden_layers"]
    p.write_text(json.dumps(data))
    with pytest.raises(JobError) as err:
        resolve_model(str(p))
    assert "text_config does not state num_hidden_layers" in str(err.value)


def test_a_missing_mlp_width_derived_from_the_others_stays_a_note(tmp_path):
    """Mamba fills intermediate_size = expand × hidden: the model the fields describe, named in
    the note (a constant default is refused: tests/reliability/test_bad_input.py)."""
    import json

    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2,
                             "vocab_size": 128, "state_size": 8, "expand": 2}))
    assert "intermediate_size = 128" in resolve_model(str(p)).note


def test_a_value_the_config_class_overrides_is_said(tmp_path):
    """transformers 5's T5Config ties the output head whatever config.json says (Flan-T5's
    ``tie_word_embeddings: false``): planned as built — the tied parameter count — and said."""
    import json

    import torch

    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "t5", "d_model": 32, "d_ff": 64, "d_kv": 8,
                             "num_heads": 4, "num_layers": 2, "vocab_size": 100,
                             "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}))
    src = resolve_model(str(p))
    assert "config.json says tie_word_embeddings false, but transformers' T5Config sets it " \
           "true" in src.note
    from transformers import T5ForConditionalGeneration
    with torch.device("meta"):
        m = T5ForConditionalGeneration(src.config)
    assert m.lm_head.weight is m.shared.weight  # what the plan counts is what is built


def test_kernels_simulated_as_their_pytorch_fallback_are_said(tmp_path):
    """Mamba's selective scan comes from mamba_ssm on a GPU that has it, from transformers'
    PyTorch loop here: the plan says its numbers are the fallback's (a QA run saw 54 s per step
    for a 130 M model without a word). A model without such kernels says nothing."""
    import importlib.util
    import json

    import pytest

    from trainfit.model.kernels import fallback_kernels

    if importlib.util.find_spec("mamba_ssm") is not None:
        pytest.skip("mamba_ssm is installed: its kernels are no fallback here")
    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2,
                             "vocab_size": 128, "state_size": 8, "expand": 2}))
    note = resolve_model(str(p)).note
    assert "mamba: transformers takes some of its kernels from causal_conv1d / mamba_ssm" in note
    assert "simulated with transformers' PyTorch fallbacks" in note
    assert ("mamba_inner_fn", "mamba_ssm") in fallback_kernels("mamba")
    assert fallback_kernels("llama") == ()
    # a text config's type: its model's module (Qwen3.5's gated delta rule from fla)
    assert ("chunk_gated_delta_rule", "fla") in fallback_kernels("qwen3_5_text")


def test_a_hub_id_without_a_network_asks_the_cache_at_once(monkeypatch):
    """An audit: with no network a hub id took ~25 s and 10 lines of huggingface_hub's retries
    before the error. A host that does not resolve sends the lookup to the local cache alone,
    and its miss is one line saying so."""
    import socket

    import pytest
    import transformers

    from trainfit.job import JobError
    from trainfit.model.source import _hub_source

    def no_dns(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")

    asked = {}

    def from_pretrained(name, **kw):
        asked.update(kw)
        raise OSError("not in the cache")
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    with pytest.raises(JobError, match="no network") as e:
        _hub_source("someorg/some-model", trust_remote_code=False)
    assert asked["local_files_only"] is True  # no download tried, so no retries
    assert "local config.json" in (e.value.hint or "")


def test_a_proxy_serves_a_host_this_machine_cannot_resolve(monkeypatch):
    """A review: behind an HTTPS proxy the hub's name need not resolve locally; such a user was
    refused as offline for every model not in the cache."""
    import socket

    from trainfit.model.source import _hub_resolves

    def no_dns(*a, **k):
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(k, raising=False)
    assert _hub_resolves() is False
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert _hub_resolves() is True
    monkeypatch.setenv("NO_PROXY", "huggingface.co")
    assert _hub_resolves() is False


def test_a_masked_lm_encoder_says_what_it_is_planned_as(tmp_path):
    """An audit: a BertForMaskedLM config planned as a causal LM ('loss over the whole logits'),
    nothing said. Its LM-head class with is_decoder off is the masked-LM step's tensors: said."""
    import json

    from trainfit.model.source import resolve_model

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 500}))
    src = resolve_model(str(tmp_path))
    assert "BertForMaskedLM planned as the model AutoModelForCausalLM builds" in src.note
    assert "bidirectional attention" in src.note
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
        "vocab_size": 500}))
    assert "ForMaskedLM" not in resolve_model(str(tmp_path)).note
