"""``python -m orthros.serving.bench_vllm``'s arguments (no vLLM needed to parse them)."""

from orthros.serving.bench_vllm import QUICK, parse_args


def test_quick_presets_only_the_sizes_not_given():
    args = parse_args(["--quick", "--prefill-lengths", "128", "512", "--layers", "4"])
    assert args.prefill_lengths == [128, 512] and args.layers == 4  # given: kept
    assert args.decode_tokens == QUICK["decode_tokens"] and args.repeats == QUICK["repeats"]
    assert parse_args(["--quick"]).prefill_lengths == QUICK["prefill_lengths"]
    assert parse_args([]).prefill_lengths == [512, 2048, 8192]
