"""``python -m orthros.serving.bench_vllm``'s arguments (no vLLM needed to parse them)."""

from orthros.serving.bench_vllm import QUICK, parse_args


def test_quick_presets_only_the_sizes_not_given():
    args = parse_args(["--quick", "--prefill-lengths", "128", "512", "--layers", "4"])
    assert args.prefill_lengths == [128, 512] and args.layers == 4  # given: kept
    assert args.decode_tokens == QUICK["decode_tokens"] and args.repeats == QUICK["repeats"]
    assert parse_args(["--quick"]).prefill_lengths == QUICK["prefill_lengths"]
    assert parse_args([]).prefill_lengths == [512, 2048, 8192]


def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys):
    """--json was written only after the whole run (minutes), and a folder or a path below a file
    failed there with a traceback, the results lost. Bad input exits 2 (it exited 1), one line."""
    import re

    import pytest

    from orthros.serving.bench_vllm import _check

    (tmp_path / "file").write_text("")
    for bad, why in ((tmp_path, "is a directory"), (tmp_path / "file" / "out.json", "is a file")):
        with pytest.raises(SystemExit) as e:
            _check(parse_args(["--json", str(bad)]))
        assert e.value.code == 2
        assert re.fullmatch(f"bench_vllm: error: --json .*{why}.*\n", capsys.readouterr().err)
    with pytest.raises(SystemExit) as e:
        _check(parse_args(["--heads", "3"]))
    assert e.value.code == 2 and "--hidden-size must be a multiple of --heads" in capsys.readouterr().err
    _check(parse_args(["--json", str(tmp_path / "new_folder" / "out.json")]))  # its folder is made at the end


def test_prompts_shorter_than_the_window_still_convert(tmp_path):
    """The models' positions were the workload's longest sequence + 16, and a window longer than
    that made the conversion refuse (``window_size=128 exceeds the source's max_position_embeddings=48``)
    after the run had started: short workloads with the default window could not be run."""
    import json

    from orthros.serving.bench_vllm import make_checkpoints

    args = parse_args(["--hidden-size", "64", "--heads", "2", "--kv-heads", "1", "--layers", "1",
                       "--intermediate-size", "64", "--vocab-size", "512", "--prefill-lengths", "32",
                       "--decode-prompt", "8", "--decode-tokens", "2"])
    _, orthros_path, max_len = make_checkpoints(args, tmp_path)
    assert max_len == 48 and json.loads((orthros_path / "config.json").read_text())["window_size"] == 128
