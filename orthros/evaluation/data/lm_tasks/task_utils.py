"""Loader for the offline lm-evaluation-harness task(s) in this folder.

lm-eval resolves ``!function task_utils.load_local_jsonl`` relative to the YAML file, and this
function resolves the data file relative to itself, so the task works from any working
directory with ``--include_path`` pointing here.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load_local_jsonl(data_file="orthros_tiny_cloze.jsonl", split="test", **_):
    import datasets

    path = Path(data_file)
    if not path.is_absolute():
        path = HERE / path
    return datasets.DatasetDict({split: datasets.load_dataset("json", data_files=str(path), split="train")})
