import json

import numpy as np
import pytest

from trainfit.data import (
    DataError,
    SampleOrder,
    builtin_tokenizer,
    label_tokens,
    make_loader,
    micro_batch_ids,
    read_rows,
    tokenize_rows,
)


@pytest.fixture(scope="module")
def tok():
    return builtin_tokenizer()


def test_builtin_tokenizer_is_bytes(tok):
    ids = tok("héllo")["input_ids"]
    assert len(ids) == len("héllo".encode())  # one token per UTF-8 byte
    assert tok.decode(ids) == "héllo"
    assert len(tok) == 259


def test_packing_counts(tok, text_jsonl):
    rows = read_rows(text_jsonl)
    total = sum(len(r["text"].encode()) + 1 for r in rows)  # + EOS per document
    d = tokenize_rows(rows, tok, seq_len=32, task="causal-lm")
    assert d.stats.packed and not d.padded
    assert d.stats.samples == total // 32
    assert d.stats.dropped_tokens == total - (total // 32) * 32
    assert all(len(x) == 32 for x in d.input_ids)


def test_custom_lm_text_is_packed_like_a_causal_lm(tok, text_jsonl):
    """A module:factory model is trained with the shifted next-token loss (model/custom.py): its
    text is packed as a causal LM's, not cut to seq_len one row each (which dropped ~90 % of a
    text file); packing asked of a model whose samples are pairs is refused."""
    rows = read_rows(text_jsonl)
    causal = tokenize_rows(rows, tok, seq_len=32, task="causal-lm")
    custom = tokenize_rows(rows, tok, seq_len=32, task="custom-lm")
    assert custom.stats.packed and custom.stats.samples == causal.stats.samples
    assert [x.tolist() for x in custom.input_ids] == [x.tolist() for x in causal.input_ids]
    assert custom.stats.notes[0].startswith("packed: ")
    with pytest.raises(DataError, match="packing: true: a seq2seq-lm model's samples"):
        tokenize_rows(rows, tok, seq_len=32, task="seq2seq-lm", packing=True)


def test_chat_truncation_is_counted(tok, chat_jsonl):
    rows = read_rows(chat_jsonl)
    d = tokenize_rows(rows, tok, seq_len=40, task="causal-lm")
    full = [len(tok.apply_chat_template(r["messages"], tokenize=True)["input_ids"]) for r in rows]
    assert d.stats.truncated_rows == sum(1 for n in full if n > 40)
    assert d.stats.truncated_rows > 0
    assert d.padded
    assert "truncated" in d.stats.notes[0]


def test_seq2seq_pairs(tok, chat_jsonl):
    d = tokenize_rows(read_rows(chat_jsonl), tok, seq_len=64, task="seq2seq-lm")
    assert d.labels is not None and len(d.labels) == 24
    assert len(d.labels[0]) == 4  # "aaaa": the last assistant turn is the target
    assert not any("reproduce its input" in n for n in d.stats.notes)
    # text rows: the text is input and target both, and that is said (an audit)
    d = tokenize_rows([{"text": "abc def"}, {"text": "ghi"}], tok, seq_len=64, task="seq2seq-lm")
    assert list(d.input_ids[0]) == list(d.labels[0])
    assert any("both the encoder's input and the decoder's target" in n for n in d.stats.notes)


def test_seq2seq_truncation_counts_rows_once(tok):
    # row 1: input and target both longer; row 2: target only; row 3: neither
    rows = [{"messages": [{"role": "user", "content": "x" * 30},
                          {"role": "assistant", "content": "y" * 30}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "z" * 30}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ok"}]}]
    d = tokenize_rows(rows, tok, seq_len=16, task="seq2seq-lm")
    assert d.stats.truncated_rows == 2
    assert "2 of 3 rows longer than seq_len 16 (1 inputs, 2 targets)" in d.stats.notes[0]


@pytest.mark.parametrize("content,msg", [
    ("", "empty"),
    ('{"text": "a"}\n{"txt": "b"}\n', "row 2 has no 'text'"),
    ('{"text": "a"}\nnot json\n', "line 2 is not valid JSON"),
    ('{"body": "a"}\n', "row 1 has no 'text'"),
])
def test_bad_data(tmp_path, tok, content, msg):
    p = tmp_path / "d.jsonl"
    p.write_text(content)
    with pytest.raises(DataError, match=msg):
        tokenize_rows(read_rows(p), tok, seq_len=16, task="causal-lm")


def test_seq_len_over_model_limit(tok, text_jsonl):
    with pytest.raises(DataError, match="longer than the model's limit of 128"):
        tokenize_rows(read_rows(text_jsonl), tok, seq_len=256, task="causal-lm", max_positions=128)


def test_order_is_a_function_of_position():
    o1, o2 = SampleOrder(10, seed=3), SampleOrder(10, seed=3)
    a = o1.ids(0, 25)
    assert a == o2.ids(0, 10) + o2.ids(10, 15)
    assert sorted(a[:10]) == list(range(10)) and sorted(a[10:20]) == list(range(10))
    assert micro_batch_ids(o1, 0, 8, 3) == [a[0:3], a[3:6], a[6:8]]
    assert micro_batch_ids(o1, 0, 8, 2, rank=1, ranks=2) == [a[4:6], a[6:8]]


def test_collate_pads_and_masks(tok, chat_jsonl):
    d = tokenize_rows(read_rows(chat_jsonl), tok, seq_len=48, task="causal-lm")
    (b,) = list(make_loader(d, "causal-lm", [[0, 5]]))
    assert b["input_ids"].shape == (2, 48)
    n0 = min(len(d.input_ids[0]), 48)
    assert int(b["attention_mask"][0].sum()) == n0
    assert (b["labels"][0, n0:] == -100).all()
    assert b["sample_ids"].tolist() == [0, 5]
    lens = [min(len(d.input_ids[i]), 48) for i in (0, 5)]
    assert label_tokens(b, "causal-lm") == sum(n - 1 for n in lens)
    assert np.array_equal(b["input_ids"][1, :lens[1]].numpy(), d.input_ids[5][:lens[1]])


def test_json_array_file(tmp_path, tok):
    p = tmp_path / "d.json"
    p.write_text(json.dumps([{"text": "abc"}, {"text": "defg"}]))
    d = tokenize_rows(read_rows(p), tok, seq_len=4, task="causal-lm")
    assert d.stats.rows == 2 and d.stats.samples == 2  # 3+1+4+1 = 9 tokens → 2 chunks of 4


def test_a_missing_relative_data_path_says_where_it_was_looked_for(tmp_path, monkeypatch):
    """An audit: "check the path" named no folder for a relative path (job files resolve theirs
    from the file's folder too)."""
    import pytest

    from trainfit.data import DataError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as e:
        read_rows("data/missing.jsonl")
    assert e.value.hint == (f"check the path: a relative path is read from the working directory "
                            f"({tmp_path}) and, in a job file, from the file's folder")
    with pytest.raises(DataError) as e:
        read_rows(tmp_path / "missing.jsonl")
    assert e.value.hint == "check the path"
