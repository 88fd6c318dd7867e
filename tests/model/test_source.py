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
