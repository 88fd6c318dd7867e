"""Job files: relative paths, catalog names beside folders."""

import pytest


def test_a_job_files_relative_paths_work_from_any_directory(tmp_path, monkeypatch):
    """tune --out wrote `data: data.jsonl` as typed, and `trainfit train` of that file from
    another directory failed with 'no such file'. Written absolute now; and read, a relative
    path that exists beside the job file (not from here) is taken from beside it."""
    from trainfit.job.files import absolute_paths, read_job_file

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "data.jsonl").write_text('{"text": "x"}\n')
    job = tmp_path / "run" / "job.yaml"
    job.write_text("model: gpt2\ndata: data.jsonl\nseq_len: 32\n")
    monkeypatch.chdir(tmp_path)
    fields, _ = read_job_file(job)
    assert fields["data"] == str(tmp_path / "run" / "data.jsonl")
    assert fields["model"] == "gpt2"  # a catalog name, no file of that name anywhere
    # one that exists only from the working directory is kept as written; one that names a
    # file here and another beside the job file is refused (the working directory's was taken
    # unsaid, and a resume from elsewhere read the other: an audit)
    (tmp_path / "data.jsonl").write_text('{"text": "y"}\n')
    (tmp_path / "sub").mkdir()
    alone = tmp_path / "sub" / "alone.yaml"
    alone.write_text("model: gpt2\ndata: data.jsonl\n")
    assert read_job_file(alone)[0]["data"] == "data.jsonl"
    from trainfit.job import JobError

    with pytest.raises(JobError, match=r"data: data\.jsonl names two files"):
        read_job_file(job)
    assert absolute_paths({"data": "data.jsonl", "model": "gpt2"}) == {
        "data": str(tmp_path / "data.jsonl"), "model": "gpt2"}


def test_a_catalog_name_is_never_taken_for_a_folder(tmp_path, monkeypatch):
    """`model: gpt2` beside a `gpt2/` folder (an output directory) stays the catalog's model, as
    resolve_model takes it; a model written as a path to a model dir is found beside the file."""
    from trainfit.job.files import absolute_paths, read_job_file

    (tmp_path / "run" / "gpt2").mkdir(parents=True)
    (tmp_path / "run" / "gpt2" / "config.json").write_text("{}")
    job = tmp_path / "run" / "job.yaml"
    job.write_text("model: gpt2\n")
    monkeypatch.chdir(tmp_path)
    assert read_job_file(job)[0]["model"] == "gpt2"
    job.write_text("model: ./gpt2\n")
    assert read_job_file(job)[0]["model"] == str(tmp_path / "run" / "./gpt2")
    monkeypatch.chdir(tmp_path / "run")
    assert absolute_paths({"model": "gpt2"}) == {"model": "gpt2"}
    assert absolute_paths({"model": "./gpt2"}) == {"model": str(tmp_path / "run" / "gpt2")}


def test_a_small_size_is_said_in_mib_and_reads_back():
    """An audit: a 3 MiB --memory-limit read "now 0.00 GiB", a 12 MiB one "0.01 GiB"."""
    from trainfit.job.files import parse_bytes, size_text

    assert size_text(3 * 2**20) == "3 MiB" and size_text(12 * 2**20) == "12 MiB"
    assert size_text(int(1.5 * 2**30)) == "1.50 GiB"
    for n in (3 * 2**20, 12 * 2**20, 2**30):
        assert abs(parse_bytes(size_text(n).replace(" ", ""), "x") - n) <= 0.01 * n


def test_a_bare_small_number_asks_for_a_unit():
    """An audit: ``--memory-limit 1.2`` (meant as GiB) read as 1 byte and was refused as
    smaller than the model's weights; a bare number is bytes, so a small or fractional one
    asks for the unit.  A byte count (a file's ``memory_limit: 1288490188``) still reads."""
    import pytest

    from trainfit.job import JobError
    from trainfit.job.files import parse_bytes

    for text in ("1.2", "64", "1000"):
        with pytest.raises(JobError, match=r"a number without a unit is bytes") as err:
            parse_bytes(text, "--memory-limit")
        assert "1.5GiB" in err.value.hint
    assert parse_bytes("1288490188", "x") == 1288490188
    assert parse_bytes("1.2GiB", "x") == int(1.2 * 2**30) and parse_bytes("7B", "x") == 7


def test_none_in_a_job_file_is_null_as_on_the_command_line(tmp_path):
    """An audit: job-fields.md types say "float or none", yet ``max_grad_norm: none`` was
    refused as "must be a number", ``quant: none`` with method full as "given with method:
    full" and ``tokenizer: none`` looked for a hub repository named "none".  A field that may
    be unset reads ``none`` as null, as its flag does; a choice named "none" stays that choice."""
    from trainfit.job import JobSpec
    from trainfit.job.files import read_job_file

    p = tmp_path / "job.yaml"
    p.write_text("model: gpt2\nseq_len: 64\nmethod: full\nmax_grad_norm: none\ntokenizer: None\n"
                 "quant: none\nlm_head_chunk: none\noffload: none\n")
    fields, _ = read_job_file(p)
    job = JobSpec.from_dict(fields)
    assert (job.max_grad_norm, job.tokenizer, job.quant, job.lm_head_chunk) == (None,) * 4
    assert job.offload == "none"


def test_a_factory_file_beside_the_job_file_is_found_from_anywhere(tmp_path, monkeypatch):
    """An audit: ``model: tiny_gpt.py:build_model`` resolved from the working directory while
    ``data:`` resolved beside the job file; run from / it read "/tiny_gpt.py does not exist"."""
    from trainfit.job.files import read_job_file

    (tmp_path / "tiny_gpt.py").write_text("def build_model():\n    return None\n")
    job = tmp_path / "j.yaml"
    job.write_text("model: tiny_gpt.py:build_model\nseq_len: 64\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert read_job_file(job, allow_code=True)[0]["model"] == \
        f"{tmp_path / 'tiny_gpt.py'}:build_model"
    monkeypatch.chdir(tmp_path)  # found from here: kept as written
    assert read_job_file(job, allow_code=True)[0]["model"] == "tiny_gpt.py:build_model"


def test_a_files_small_number_memory_limit_asks_for_a_unit():
    """A review: ``memory_limit: 1.2`` (a YAML float) bypassed the flag's rule and read as one
    byte; a byte count still reads."""
    import pytest

    from trainfit.job import JobError
    from trainfit.job.files import file_memory_limit

    with pytest.raises(JobError, match=r"a number without a unit is bytes"):
        file_memory_limit({"memory_limit": 1.2})
    assert file_memory_limit({"memory_limit": 1288490188}) == 1288490188
    assert file_memory_limit({"memory_limit": "2GiB"}) == 2 * 2**30
