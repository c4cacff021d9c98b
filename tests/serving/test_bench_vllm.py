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


def test_a_vocabulary_without_room_for_the_prompt_ids_is_refused_before_the_run(capsys):
    """Prompt token ids are drawn from 10 .. vocab-size - 1: --vocab-size 10 built and loaded both
    models, then died in the first workload (torch's 'random_ expects from to be less than to')."""
    import pytest

    from orthros.serving.bench_vllm import _check

    with pytest.raises(SystemExit) as e:
        _check(parse_args(["--vocab-size", "10"]))
    assert e.value.code == 2 and "--vocab-size must be > 10" in capsys.readouterr().err


def test_a_head_dim_the_cpu_attention_does_not_take_is_refused_before_the_run(capsys):
    """head_dim 40 passed the check (>= 32), then both models were built and loaded and the first
    generate died in vLLM's CPU attention ('Unsupported CPU attention configuration: head_dim=40')."""
    import pytest

    pytest.importorskip("vllm")
    from orthros.serving.bench_vllm import _check

    with pytest.raises(SystemExit) as e:
        _check(parse_args(["--hidden-size", "80", "--heads", "2", "--kv-heads", "1"]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "head_dim 40" in err and "64" in err, err
    _check(parse_args(["--hidden-size", "64", "--heads", "2", "--kv-heads", "1"]))  # head_dim 32: taken


def test_the_engine_runs_in_this_process_whatever_the_environment(monkeypatch):
    """tok/CPU-s counts this process's CPU time: with VLLM_ENABLE_V1_MULTIPROCESSING=1 in the
    environment (it was only a default) the engine ran in a child process and the bench reported
    some 40x the in-process figure."""
    import os

    import pytest

    pytest.importorskip("vllm")
    from orthros.serving import bench_vllm

    seen = []

    def stop(*a, **k):
        seen.append(os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
        raise KeyboardInterrupt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setattr(bench_vllm, "make_checkpoints", stop)
    with pytest.raises(KeyboardInterrupt):
        bench_vllm.main(["--hidden-size", "64", "--heads", "2", "--kv-heads", "1"])
    assert seen == ["0"]


def test_a_sequence_the_kv_cache_cannot_hold_is_refused_before_the_run(capsys):
    """Each engine gets 2 GiB of KV cache: --prefill-lengths 140000 at the default shape (16 KiB a
    token) made both checkpoints, loaded the Orthros model, and died in vLLM's KV-cache check with a
    traceback that advised raising gpu_memory_utilization, which the bench does not take."""
    import pytest

    from orthros.serving.bench_vllm import _check

    with pytest.raises(SystemExit) as e:
        _check(parse_args(["--prefill-lengths", "140000"]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and "140016 tokens" in err and "2,190 MiB" in err and "2,048 MiB" in err and "--prefill-lengths" in err, err
    _check(parse_args(["--prefill-lengths", "130928"]))  # 130,944 tokens: the most vLLM takes in 2 GiB here
    _check(parse_args(["--prefill-lengths", "140000", "--layers", "4"]))  # half the K/V a token


def test_a_prefill_length_given_twice_is_one_workload():
    """--prefill-lengths 32 32 ran the workload twice (warm-up and repeats) and reported it once."""
    assert parse_args(["--prefill-lengths", "32", "64", "32"]).prefill_lengths == [32, 64]


def test_more_prefill_prompts_than_tokens_a_step_still_start(monkeypatch):
    """max_num_batched_tokens was the longest prompt (or the decode batch's tokens), and vLLM
    refuses fewer than max_num_seqs: --prefill-batch 40 of 4-token prompts made both checkpoints,
    then died in vLLM's SchedulerConfig ('max_num_batched_tokens (18) must be greater than or equal
    to max_num_seqs (40)')."""
    import pytest

    vllm = pytest.importorskip("vllm")
    from orthros.serving import bench_vllm

    seen = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kw: seen.update(kw))
    args = parse_args(["--prefill-lengths", "4", "--prefill-batch", "40", "--decode-prompt", "8",
                       "--decode-batch", "2"])
    bench_vllm.make_llm("ckpt", bench_vllm.model_len(args), args)
    assert seen["max_num_seqs"] == 40 and seen["max_num_batched_tokens"] >= 40


def test_without_vllm_one_clean_error_line(monkeypatch, capsys):
    """Without vLLM the bench printed a bare 'error: vLLM is not installed here', unlike its own
    other refusals ('bench_vllm: error: ...'): one line, the same prefix, exit 2, nothing made."""
    import re
    import sys

    import pytest

    from orthros.serving import bench_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    made = []
    monkeypatch.setattr(bench_vllm, "make_checkpoints", lambda *a: made.append(a))
    with pytest.raises(SystemExit) as e:
        bench_vllm.main(["--quick"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"bench_vllm: error: vLLM is not installed here \(see docs/serving\.md[^\n]*\)\n", err), err
    assert not made
