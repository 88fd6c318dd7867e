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
