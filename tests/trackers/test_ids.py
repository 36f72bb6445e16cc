"""trackers/ids.py: the tracker run ids kept beside a run's record."""

from __future__ import annotations

from rollfilter.trackers.ids import keep_ids, read_ids, read_places


def test_ids_kept_are_read_back_for_the_same_key_only(tmp_path):
    path = str(tmp_path / "out.jsonl.trackers.json")
    assert read_ids(path) == {}
    keep_ids(path, {"mlflow": "abc", "wandb": "x1"}, key="a\nb")
    assert read_ids(path, key="a\nb") == {"mlflow": "abc", "wandb": "x1"}
    assert read_ids(path) == {}  # kept for other files
    assert read_ids(None) == {}
    assert list(tmp_path.iterdir()) == [tmp_path / "out.jsonl.trackers.json"]  # no temporary left


def test_a_file_that_is_not_ours_holds_no_ids(tmp_path):
    path = tmp_path / "ids.json"
    for text in ("not json", "[1]", '{"key": "", "ids": [1]}', '{"key": "", "ids": {"mlflow": 5}}'):
        path.write_text(text)
        assert read_ids(str(path)) == {}


def test_where_each_run_is_kept_is_read_back_with_its_ids(tmp_path):
    path = str(tmp_path / "out.jsonl.trackers.json")
    keep_ids(path, {"mlflow": "abc"}, key="k", places={"mlflow": "math-eval"})
    assert read_places(path, key="k") == {"mlflow": "math-eval"}
    assert read_places(path) == {}  # kept for other files
    (tmp_path / "older.json").write_text('{"key": "", "ids": {"mlflow": "abc"}}')  # kept before places were
    assert read_places(str(tmp_path / "older.json")) == {}
