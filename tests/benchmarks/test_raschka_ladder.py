"""The GPT-2 ladder benchmark plans the ladder's own model code through trainfit's own-model
front door: each row's ops are its code's (hand-written norms, the book's attention, SDPA, the
padded vocabulary), and the alignment of its head follows its vocabulary."""

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from speed_cases import _ladder_factory  # noqa: E402


@pytest.mark.parametrize(("case_id", "factory"), [
    ("raschka_gpt2-124m_1xa100_00_baseline", "ladder_00"),
    ("raschka_gpt2-124m_1xa100_05_bf16", "ladder_01"),
    ("raschka_gpt2-124m_1xa100_06_torch_layernorm_gelu", "ladder_06"),
    ("raschka_gpt2-124m_1xa100_08_torch_compile", "ladder_07"),
    ("raschka_gpt2-124m_1xa100_09_vocab_50304", "ladder_09"),
    ("raschka_gpt2-124m_4xa100_ddp_compile_bf16", "ladder_09"),
])
def test_each_row_gets_the_model_code_it_ran(case_id, factory):
    assert _ladder_factory(case_id) == factory


def _ops(factory: str):
    from trainfit.job import JobSpec
    from trainfit.memory.simulate import SimTarget, simulate_step
    from trainfit.model.source import resolve_model
    from trainfit.speed.ops import OpRecorder

    src = resolve_model(f"{BENCH / 'raschka_gpt.py'}:{factory}")
    assert (src.config.hidden_size, src.config.num_hidden_layers) == (768, 12)
    rec = OpRecorder()
    simulate_step(JobSpec(model=src.name, seq_len=32, micro_batch=1, precision="bf16-true"), src,
                  SimTarget(device="cuda", compute_capability=(8, 0)), op_hook=rec)
    return src, rec.ops


def test_the_rows_ops_are_their_codes():
    src01, book = _ops("ladder_01")
    _, torch_norms = _ops("ladder_06")
    src09, sdpa = _ops("ladder_09")
    names = {o.name for o in book}
    # the book's LayerNorm/GELU and attention: composed elementwise ops, an explicit mask
    assert {"var", "tanh", "pow", "masked_fill_", "_softmax"} <= names
    assert "native_layer_norm" not in names
    assert "native_layer_norm" in {o.name for o in torch_norms}
    assert len(torch_norms) < len(book)
    assert any("flash" in o.name for o in sdpa) and "_softmax" not in {o.name for o in sdpa}
    # vocabulary 50,257: the head's three GEMMs are unaligned; padded to 50,304 none is
    assert src01.config.vocab_size == 50257 and src09.config.vocab_size == 50304
    assert sum(not o.aligned for o in book) == 3
    assert all(o.aligned for o in sdpa)
