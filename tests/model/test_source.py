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


def test_a_multimodal_config_is_one_clear_line_naming_what_planning_its_text_would_leave_out(
        tmp_path):
    """Gemma-3-4B's config.json as published: a language model in text_config (its heads and
    vocabulary left to Gemma3TextConfig's defaults) beside a SigLIP vision tower.  Planning the
    text model alone would leave the tower out (an under-prediction): refused, with the text
    model's full sizes in the hint, the tower's in the error."""
    import json

    import pytest

    from trainfit.job import JobError
    from trainfit.model.source import resolve_model

    p = tmp_path / "config.json"
    p.write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"hidden_size": 256, "intermediate_size": 512, "model_type": "gemma3_text",
                        "num_hidden_layers": 4},
        "vision_config": {"hidden_size": 64, "image_size": 224, "intermediate_size": 128,
                          "model_type": "siglip_vision_model", "num_attention_heads": 4,
                          "num_hidden_layers": 2, "patch_size": 14}}))
    with pytest.raises(JobError) as err:
        resolve_model(str(p))
    assert "Gemma3ForConditionalGeneration is a multimodal model" in str(err.value)
    assert "siglip_vision_model: num_hidden_layers 2, hidden_size 64, intermediate_size 128" \
        in str(err.value)
    hint = err.value.hint
    assert "num_attention_heads: 8" in hint and "vocab_size: 262208" in hint  # the defaults
    assert "model_type: gemma3_text" in hint
