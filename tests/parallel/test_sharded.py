"""Sequence-parallel prefill and sharded decode (orthros.parallel) on CPU with gloo.

Sharded prefill + greedy decode over 2-4 processes must give the logits and tokens of one
process (fp32, tight tolerance), for prompt lengths that do not divide evenly and halos that
cross several shards; a failing or stalled rank must make every rank exit with a clear error.
"""

import datetime
import re

import pytest
import torch

from orthros import OrthrosForCausalLM
from orthros.models import OrthrosCache
from orthros.ops import full_attention_reference
from orthros.parallel import (ParallelContext, ShardedOrthros, halo_from_tails, merge_partials, partial_attention,
                              shard_bounds)
from orthros.parallel.testing import case_generate, run_ranks

from conftest import rel as rel_err, tiny_model as _tiny_model

V = 97
W = 12  # window: shards of 3-6 tokens below make halos of 11 rows cross 2-3 shards


def tiny_model(seed=0, **kw):
    return _tiny_model(seed, **{**dict(hidden_size=48, intermediate_size=80, window_size=W, qk_norm=True,
                                       attn_backend="reference"), **kw})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_orthros")
    tiny_model().save_pretrained(d)
    return str(d)


@torch.no_grad()
def reference_generate(model, ids, n_new):
    cache = OrthrosCache()
    out = model(ids, logits_to_keep=1, past_key_values=cache, use_cache=True)
    logits, toks = [out.logits], []
    for j in range(n_new):
        t = out.logits[:, -1].argmax(-1)
        toks.append(t)
        if j == n_new - 1:
            break
        out = model(t.view(-1, 1), past_key_values=cache, use_cache=True)
        logits.append(out.logits)
    return torch.stack(toks, 1), torch.cat(logits, 1)





# ---------------------------------------------------------------- pieces, one process

def test_shard_bounds_balanced_and_validated():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="at least one token per rank"):
        shard_bounds(3, 4)
    with pytest.raises(ValueError, match=r"the prompt \(1 token\) must"):  # was "(1 tokens)"
        shard_bounds(1, 2)
    with pytest.raises(ValueError, match="seq_len"):
        shard_bounds(0, 1)
    for bad in (2.0, True, "2"):  # were a TypeError of range() / '<', or one shard for True
        with pytest.raises(ValueError, match="world_size"):
            shard_bounds(10, bad)


def test_halo_crosses_several_shards():
    bounds = shard_bounds(11, 4)  # 3, 3, 3, 2 tokens
    wm1 = 7
    pos = torch.arange(11).float()
    counts = [min(e - s, wm1) for s, e in bounds]
    tails = torch.full((4, 1, wm1), -1.0)
    for j, (s, e) in enumerate(bounds):
        c = counts[j]
        tails[j, 0, wm1 - c:] = pos[e - c:e]
    for r, (s, _) in enumerate(bounds):
        halo = halo_from_tails(tails, counts, r, wm1)[0]
        assert halo.tolist() == pos[max(0, s - wm1):s].tolist()
    assert halo_from_tails(tails, counts, 4, wm1)[0].tolist() == pos[11 - wm1:].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_partial_attention_merge_is_exact(dtype):
    torch.manual_seed(1)
    B, Hq, Hkv, D, L = 2, 6, 2, 10, 53
    q = torch.randn(B, 1, Hq, D, dtype=dtype)
    k = torch.randn(B, L, Hkv, D, dtype=dtype)
    v = torch.randn(B, L, Hkv, D, dtype=dtype)
    ref = full_attention_reference(q, k, v, torch.tensor([[L - 1]]), scale=D ** -0.5)
    cuts = [0, 0, 7, 8, 30, L]  # includes an empty split
    parts = [partial_attention(q, k[:, a:b], v[:, a:b], key_chunk=5) for a, b in zip(cuts[:-1], cuts[1:])]
    o, lse = merge_partials(torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert rel_err(o, ref) < tol
    full_lse = torch.logsumexp(torch.einsum("bmhgd,blhd->bmhgl", q.view(B, 1, Hkv, 3, D), k) * D ** -0.5, -1)
    assert rel_err(lse, full_lse.reshape(B, 1, Hq)) < tol
    assert torch.isinf(parts[0][1]).all() and (parts[0][0] == 0).all()


@pytest.mark.parametrize("T,chunk", [(1, 4), (29, 5), (40, 64)])
def test_single_process_equals_model(T, chunk):
    model = tiny_model()
    ids = torch.randint(0, V, (2, T))
    toks, logits = reference_generate(model, ids, 5)
    got_t, got_l, cache = ShardedOrthros(model, ParallelContext.single(), chunk_size=chunk, reserve=1).generate(ids, 5)
    assert torch.equal(got_t, toks)
    assert rel_err(got_l, logits) < 1e-5
    assert cache.length == T + 4 and cache.seq_len == T + 4


def test_single_process_equals_model_with_the_attention_output_gate():
    """Qwen3.5's attention output gate (``attn_output_gate``: q_proj also holds a gate a head, and
    the attention output is multiplied by its sigmoid before W_O) in every sequence-parallel
    piece: the window chunks, the output query's merge, and the decode pair."""
    model = tiny_model(seed=3, attn_output_gate=True)
    ids = torch.randint(0, V, (2, 29))
    toks, logits = reference_generate(model, ids, 5)
    got_t, got_l, _ = ShardedOrthros(model, ParallelContext.single(), chunk_size=5, reserve=1).generate(ids, 5)
    assert torch.equal(got_t, toks)
    assert rel_err(got_l, logits) < 1e-5


def test_window_longer_than_the_prompt_sends_only_the_shards_tails():
    """The gathered tail of every rank was w - 1 rows whatever the shard's length: a window of 10**12 (full
    attention, which the model runs) allocated 96 TB; 10**6 gathered ~100 MB a layer for a 9-token prompt. The
    slot is the longest tail (at most w - 1 rows); the multi-rank test covers slots shorter than w - 1."""
    model = tiny_model(window_size=10**12)
    ids = torch.randint(0, V, (2, 9))
    toks, logits = reference_generate(model, ids, 3)
    got_t, got_l, cache = ShardedOrthros(model, ParallelContext.single(), chunk_size=4).generate(ids, 3)
    assert torch.equal(got_t, toks) and rel_err(got_l, logits) < 1e-5
    assert cache.window_k[0].shape[1] == 11  # the whole sequence is the decode window


def test_positions_past_the_model_s_are_warned_as_the_model_warns():
    """A prompt, or a generation, past ``max_position_embeddings`` is computed with the model's warning (it ran
    without a word); within the positions, none."""
    import warnings

    model = tiny_model(max_position_embeddings=32)
    sh = ShardedOrthros(model, ParallelContext.single(), chunk_size=5, reserve=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sh.generate(torch.randint(0, V, (1, 28)), 5)  # positions 0..31
    with pytest.warns(UserWarning, match="beyond max_position_embeddings=32"):
        sh.generate(torch.randint(0, V, (1, 28)), 6)
    with pytest.warns(UserWarning, match="beyond max_position_embeddings=32"):
        sh.prefill(torch.randint(0, V, (1, 33)))
    # a decode loop of one's own: the step to position 32 warns (it ran without a word), the one to 31 not
    _, cache = sh.prefill(torch.randint(0, V, (1, 31)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sh.decode_step(torch.tensor([1]), cache)
    with pytest.warns(UserWarning, match="beyond max_position_embeddings=32"):
        sh.decode_step(torch.tensor([1]), cache)
    with warnings.catch_warnings(record=True) as seen:  # generate warns once, for all its positions
        warnings.simplefilter("always")
        sh.generate(torch.randint(0, V, (1, 28)), 8)
    assert len(seen) == 1, [str(w.message) for w in seen]
    # each warning names the caller's line (it named torch's no_grad wrapper, one line that every call shared, so
    # Python's default filter showed the first of them only)
    for call in (lambda: sh.generate(torch.randint(0, V, (1, 28)), 8), lambda: sh.prefill(torch.randint(0, V, (1, 33))),
                 lambda: sh.decode_step(torch.tensor([1]), cache)):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            call()
        assert [w.filename for w in seen] == [__file__]


@pytest.mark.parametrize("gate", [False, True])
def test_transformer_baseline_prefill_equals_the_full_attention_model(gate):
    """The benchmark's Transformer baseline (the layer pieces with SDPA) gives the logits of the
    same weights run as a full-attention model, with and without the attention output gate."""
    from orthros.parallel.baseline import transformer_prefill

    model = tiny_model(seed=5, attention_mode="full", attn_output_gate=gate).eval()
    ids = torch.randint(0, V, (2, 23))
    pos = torch.arange(23).expand(2, 23)
    got, cache = transformer_prefill(model, ids, pos, chunk_size=7)
    with torch.no_grad():
        want = model(ids).logits[:, -1:]
    assert rel_err(got, want) < 1e-5 and len(cache) == model.config.num_hidden_layers


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="attention_mode"):
        ShardedOrthros(tiny_model(attention_mode="full"))
    # another architecture's model (its config has no attention_mode): an AttributeError of the config
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2))
    with pytest.raises(TypeError, match="model must be an OrthrosForCausalLM, got LlamaForCausalLM"):
        ShardedOrthros(llama)
    sh = ShardedOrthros(tiny_model())
    with pytest.raises(TypeError, match="input_ids"):
        sh.prefill(torch.zeros(1, 4))
    # an int16 tensor was told it must be 'an integer torch.Tensor'; a list likewise, naming nothing
    for bad, got in ((torch.zeros(1, 4, dtype=torch.int16), "torch.int16"), ([[1, 2]], "list")):
        with pytest.raises(TypeError, match=rf"input_ids must be an int32 or int64 torch.Tensor \[B, T\], got {got}"):
            sh.prefill(bad)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sh.generate(torch.zeros(1, 4, dtype=torch.long), 0)
    # generate of a list: an AttributeError ('list' object has no attribute 'shape'), where prefill names input_ids
    with pytest.raises(TypeError, match=r"input_ids must be an int32 or int64 torch.Tensor \[B, T\], got list"):
        sh.generate([[1, 2]], 2)
    # ids outside the vocabulary: an IndexError of the embedding on one rank (a device assert on CUDA)
    for bad in (torch.tensor([[1, V]]), torch.tensor([[-1, 2]])):
        with pytest.raises(ValueError, match="vocab_size"):
            sh.prefill(bad)
    with pytest.raises(ValueError, match="reserve"):
        ShardedOrthros(tiny_model(), reserve=None)
    with pytest.raises(ValueError, match="reserve"):
        ShardedOrthros(tiny_model(), reserve=-3)
    with pytest.raises(TypeError, match="ctx"):
        ShardedOrthros(tiny_model(), 2)
    _, cache = sh.prefill(torch.ones(1, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="tokens"):
        sh.decode_step(torch.tensor([1.7]), cache)  # was truncated to token 1
    with pytest.raises(ValueError, match="vocab_size"):
        sh.decode_step(torch.tensor([V]), cache)
    # one token per row: two tokens for the one row were read as 2 rows ('tokens has 2 rows')
    for bad in (torch.tensor([[1, 2]]), torch.tensor([1, 2]), torch.tensor(1)):
        with pytest.raises(ValueError, match=r"tokens must be \[B\] or \[B, 1\] with B = 1"):
            sh.decode_step(bad, cache)
    assert cache.seq_len == 4 and cache.length == 4
    # an empty prompt was refused as 'seq_len must be an integer >= 1', naming no argument of prefill
    for bad in (torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long)):
        with pytest.raises(ValueError, match=r"input_ids must be \[B, T\] with B, T >= 1"):
            sh.prefill(bad)


def test_decode_step_refuses_a_cache_that_is_not_this_model_s_on_this_rank():
    """A cache that is not a ShardedKVCache was an AttributeError ('... has no attribute seq_len'); another
    model's (fewer layers) an IndexError; another world's (a cache of rank 0 of 2 on one process) other
    logits without a word. Each is refused naming ``cache``, and the cache is left as it was."""
    from orthros.models import OrthrosCache
    from orthros.parallel import ShardedKVCache

    model = tiny_model()
    sh = ShardedOrthros(model, chunk_size=4)
    for bad in (OrthrosCache(), None):
        with pytest.raises(TypeError, match="cache must be the ShardedKVCache prefill\\(\\) returned, got"):
            sh.decode_step(torch.tensor([1]), bad)
    _, other = ShardedOrthros(tiny_model(num_hidden_layers=2)).prefill(torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="cache is not this model's on this rank: it holds 2 layers"):
        sh.decode_step(torch.tensor([1]), other)
    _, mine = sh.prefill(torch.ones(1, 6, dtype=torch.long))
    two = ShardedKVCache(mine.num_layers, shard_bounds(6, 2), 0, 0)  # rank 0's shard of a 2-rank prefill
    two.k, two.v, two.window_k, two.window_v = mine.k, mine.v, mine.window_k, mine.window_v
    two.length, two.seq_len = 3, 6
    with pytest.raises(ValueError, match="for rank 0 of 2, this model and rank need 3 layers .* for rank 0 of 1"):
        sh.decode_step(torch.tensor([1]), two)
    assert two.seq_len == 6 and mine.seq_len == 6
    assert sh.decode_step(torch.tensor([1]), mine).shape == (1, 1, V)


@pytest.mark.parametrize("args, env, match", [
    (["--chunk-size", "0"], {}, "--chunk-size"),
    (["--key-chunk", "-1"], {}, "--key-chunk"),
    (["--warmup", "0"], {}, "--warmup"),
    (["--check-len", "-5"], {}, "--check-len"),
    (["--layers", "0"], {}, "--layers"),
    (["--window", "0"], {}, "--window"),
    (["--single-max", ""], {}, "--single-max"),
    (["--single-max", "1K,2K"], {}, "--single-max"),
    (["--timeout", "-1"], {}, "--timeout"),
    (["--timeout", "inf"], {}, "--timeout"),  # an OverflowError of timedelta on every rank, after the start
    (["--time-budget", "-1"], {}, "--time-budget"),
    # an OverflowError of timedelta on every rank, after the model was built (the idle ranks' group)
    (["--time-budget", "inf"], {}, "--time-budget"),
    (["--time-budget", "1e15"], {}, "--time-budget"),
    # an OverflowError of timedelta in init_process_group; 1e10 s made gloo's every collective time out at once
    (["--timeout", "1e10"], {}, "--timeout"),
    (["--lengths", "1,300"], {"WORLD_SIZE": "2"}, "one token per rank"),
    # a bare "invalid literal for int()" traceback of reading torchrun's WORLD_SIZE
    ([], {"WORLD_SIZE": "abc"}, "environment variable WORLD_SIZE is 'abc': it must be an integer >= 1"),
    # torch's context_parallel drops its head-tail load balancing without a word there: the record still said
    # 'context_parallel ring attention' (load-balanced, docs), or the run failed after the Orthros ones
    (["--transformer-cp", "64K,301"], {"WORLD_SIZE": "2"}, "multiples of 2 x the number of ranks (4)"),
    # the length was named without its suffix ('1.5', '')
    (["--lengths", "1.5K"], {}, "bad length '1.5K'"),
    (["--extra-lengths", "M"], {}, "bad length 'M'"),
    (["--out", "{tmp}/missing/bench.json"], {}, "does not exist"),
    # built the 8B model on the CPU (16 GB), then prefilled 64K-512K tokens there
    (["--model", "qwen3-8b"], {}, "--model qwen3-8b is a GPU measurement; on the CPU use --model tiny"),
    (["--out", "{tmp}"], {}, "is a directory"),
    # ran only when WORLD_SIZE > 1: on one rank the lengths were accepted and nothing ran
    (["--transformer-cp", "1K"], {"WORLD_SIZE": "1"},
     "--transformer-cp runs the Transformer with context parallelism over several"),
    # ran the Orthros lengths, then recorded a NotImplementedError (no sharding strategy for the CPU's SDPA)
    (["--transformer-cp", "1K"], {"WORLD_SIZE": "2"}, "--transformer-cp needs CUDA"),
])
def test_bench_rejects_bad_arguments_before_any_work(args, env, match, tmp_path, monkeypatch, capsys):
    """Bad ``python -m orthros.parallel.bench`` arguments end in a usage error naming the flag,
    before the process group starts or a model is built (they failed after, or silently did
    nothing: a negative time budget skipped every run)."""
    from orthros.parallel import bench

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    def started(*a, **k):
        raise RuntimeError("the process group was started")

    def exit_(code):  # main's last resort (os._exit) must not end the test session
        raise SystemExit(f"os._exit({code})")

    monkeypatch.setattr(bench, "init_from_env", started)
    monkeypatch.setattr(bench.os, "_exit", exit_)
    base = ["--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "b.json")]
    with pytest.raises(SystemExit) as e:
        bench.main(base + [a.format(tmp=tmp_path) for a in args])
    assert e.value.code == 2
    assert match in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_on_the_cpu_drops_the_default_context_parallel_baseline(tmp_path, monkeypatch):
    """The default --transformer-cp (64K,128K, a GPU baseline) is not run on the CPU, where PyTorch's context
    parallelism has no sharding strategy for the attention: a CPU run of several ranks ended in an 'error' record."""
    from orthros.parallel import bench

    monkeypatch.setenv("WORLD_SIZE", "2")
    a = bench.parse_args(["--model", "tiny", "--device", "cpu", "--lengths", "1K", "--out", str(tmp_path / "b.json")])
    assert a.transformer_cp == []


@pytest.mark.parametrize("rank", ["0", "1", "3"])
def test_bench_argument_errors_and_help_are_printed_by_rank_0_only(rank, tmp_path, monkeypatch, capsys):
    """Under torchrun every rank printed the usage and the error (or the whole --help). Only rank 0 prints;
    the others exit with the same code, after an error first waiting for rank 0 to print it (torchrun stops
    every rank once one fails, which could be before rank 0 had printed anything); --help waits for nothing."""
    from orthros.parallel import bench

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", rank)
    waited = []
    monkeypatch.setattr(bench.time, "sleep", waited.append)
    monkeypatch.setattr(bench, "init_from_env", lambda *a, **k: pytest.fail("the process group was started"))
    quiet = rank != "0"
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "tiny", "--device", "cpu", "--warmup", "0", "--out", str(tmp_path / "b.json")])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert (out.out + out.err == "") == quiet and ("argument --warmup" in out.err) != quiet
    assert waited == ([bench._Parser.QUIET_RANK_WAIT_S] if quiet else [])
    with pytest.raises(SystemExit) as e:
        bench.main(["--help"])
    assert e.value.code in (0, None)
    out = capsys.readouterr()
    assert (out.out + out.err == "") == quiet and ("usage:" in out.out) != quiet
    assert len(waited) == (1 if quiet else 0)


def test_bench_lengths_given_twice_are_measured_once(tmp_path):
    # '--lengths 64,1K,64,1024' measured 64 and 1024 twice each (two records of one key; the table showed the first)
    from orthros.parallel.bench import parse_args

    a = parse_args(["--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "b.json"), "--lengths", "64,1K,64,1024",
                    "--transformer", "2K,2048", "--transformer-cp", "", "--single-max", "1K,1024"])
    assert a.lengths == [64, 1024] and a.transformer == [2048] and a.single_max == 1024


# ---------------------------------------------------------------- gloo, 2-4 processes

CASES = {
    # world: [(B, T, new tokens, chunk)] -- T a multiple of the world size only at one token a rank
    2: [(2, 37, 6, 5), (1, 3, 4, 2), (2, 2, 3, 1)],  # and one token a rank
    3: [(2, 10, 6, 3)],  # shards 4,3,3: rank 2's halo spans ranks 1 and 0
    4: [(1, 13, 6, 2), (2, 23, 5, 4), (1, 4, 3, 2)],  # shards 4,3,3,3 (halo over 3 shards), 6,6,6,5 and 1,1,1,1
}


def test_sharded_generate_equals_one_process(model_dir):
    """One set of 4 gloo processes checks groups of 2, 3 and 4 ranks."""
    model = OrthrosForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    cases = {w: [(torch.randint(0, V, (B, T), generator=g), n, c) for B, T, n, c in CASES[w]] for w in CASES}
    run = run_ranks(case_generate, 4, timeout_s=60, join_timeout=170, model_dir=model_dir, cases=cases,
                    sizes=[2, 3, 4])
    assert not run["hung"] and not run["errors"], run["errors"]
    for world in CASES:
        for ci, (ids, n_new, _) in enumerate(cases[world]):
            toks, logits = reference_generate(model, ids, n_new)
            bounds = shard_bounds(ids.shape[1], world)
            for r in range(world):
                got = run["results"][r][world][ci]
                assert got["bounds"] == bounds
                assert torch.equal(got["tokens"], toks), (world, r, got["tokens"], toks)
                assert rel_err(got["logits"], logits) < 1e-5
                # the cache stays sharded: decoded tokens live on the last rank only
                n_local = bounds[r][1] - bounds[r][0] + (n_new - 1 if r == world - 1 else 0)
                assert got["local_len"] == n_local
                assert got["window_rows"] == min(W - 1, ids.shape[1] + n_new - 1)


@pytest.mark.parametrize("mode", ["raise", "stall"])
def test_failing_rank_stops_every_rank(model_dir, mode):
    ids = torch.randint(0, V, (1, 20))
    # layer 0: rank 1 fails before it waits on any collective, so its own error is the injected
    # one even when a loaded machine delays rank 0 past the 4 s collective timeout; a stall lasts until rank 0
    # has failed (its timeout ran out), here at most 60 s
    fail = dict(rank=1, layer=0, mode=mode, stall_s=60)
    run = run_ranks(case_generate, 2, timeout_s=4, join_timeout=90, model_dir=model_dir,
                    cases={2: [(ids, 3, 4)]}, fail=fail)
    assert not run["hung"], f"ranks {run['hung']} hung"
    assert all(c != 0 for c in run["exitcodes"]), run["exitcodes"]
    assert "ParallelError" in run["errors"][0] and "collective 'prefill layer" in run["errors"][0]
    if mode == "raise":
        assert "injected failure on rank 1" in run["errors"][1]
    else:
        assert "ParallelError" in run["errors"][1]


def test_bench_entry_point_runs_under_torchrun(tmp_path):
    """The benchmark entry (tiny model, gloo, CPU) runs end to end and writes its JSON."""
    import json
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "orthros.parallel.bench",
           "--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--lengths", "300", "--transformer", "256,512",
           "--transformer-cp", "", "--warmup", "64", "--check-len", "50", "--chunk-size", "128", "--timeout", "60",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = json.loads(out.read_text())["records"]
    check = [r for r in recs if r.get("check")][0]
    assert max(check["rel_err_logits"]) < 1e-5 and check["same_argmax"]
    got = {(r["model"], r["gpus"], r["tokens"], r["status"]) for r in recs if "tokens" in r and not r.get("check")}
    assert {("orthros", 2, 300, "ok"), ("orthros", 1, 300, "ok"), ("transformer", 1, 512, "ok"),
            ("transformer", 2, 300, "estimate")} <= got
    assert "| 300 |" in proc.stdout


@pytest.mark.parametrize("rank", ["0", "1"])
def test_bench_ctrl_c_is_one_line_from_rank_0(rank, tmp_path, monkeypatch, capsys):
    """Ctrl-C under torchrun reaches every rank: each printed 'rank r FAILED: KeyboardInterrupt: ' and a
    traceback, and exited 1. Now rank 0 prints one line naming the results written so far, the others
    nothing; every rank exits 130 (interrupted)."""
    import json

    from orthros.parallel import bench

    def exit_(code):
        raise SystemExit(code)

    def interrupted(self):
        self.meta, self.records = {}, [{"tokens": 8}]
        self.save()
        raise KeyboardInterrupt

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(bench.os, "_exit", exit_)
    monkeypatch.setattr(bench.Bench, "run", interrupted)
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "tiny", "--device", "cpu", "--out", str(out)])
    assert e.value.code == 130
    err = capsys.readouterr().err
    if rank == "0":
        assert err == f"orthros.parallel.bench: interrupted; the records measured so far are in {out}\n"
        assert json.loads(out.read_text())["records"] == [{"tokens": 8}]
    else:
        assert err == ""


def test_bench_refuses_cuda_without_a_gpu_before_any_work(tmp_path, monkeypatch, capsys):
    """``--device cuda`` on a machine without CUDA: a usage error naming the flag (it was an
    AssertionError traceback of ``torch.cuda.current_device()`` after the process group started)."""
    from orthros.parallel import bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "init_from_env", lambda *a, **k: pytest.fail("the process group was started"))
    monkeypatch.setattr(bench.os, "_exit", lambda code: pytest.fail(f"os._exit({code})"))
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "tiny", "--device", "cuda", "--out", str(tmp_path / "b.json")])
    assert e.value.code == 2
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_bench_results_are_replaced_whole(tmp_path):
    """The results JSON is rewritten after every record; a write that fails part-way (here a
    record JSON cannot encode) leaves the previous file whole (open(..., 'w') had truncated it
    and json.dump had written half a record)."""
    import argparse
    import json

    from orthros.parallel import bench

    out = tmp_path / "b.json"
    b = bench.Bench(argparse.Namespace(out=str(out)), ParallelContext.single(), torch.device("cpu"))
    b.meta = {"world_size": 1}
    b.records = [{"tokens": 8}]
    b.save()
    before = out.read_text()
    b.records.append({"tokens": 16, "bad": object()})
    with pytest.raises(TypeError):
        b.save()
    assert out.read_text() == before and json.loads(before)["records"] == [{"tokens": 8}]
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]


def test_bench_records_the_checkout_commit(tmp_path, monkeypatch, capsys):
    """Without ``ORTHROS_COMMIT`` the results name this checkout's commit, as the other
    benchmarks do (they said 'unknown'); one process, tiny model, CPU. Its table has no N-GPU
    columns (with one process they repeated the 1-GPU ones under the same names)."""
    import json

    from orthros.parallel import bench
    from orthros.utils import commit_id

    monkeypatch.delenv("ORTHROS_COMMIT", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "b.json"
    assert bench.main(["--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--lengths", "40", "--transformer", "",
                       "--transformer-cp", "", "--warmup", "16", "--check-len", "20", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["meta"]["commit"] == (commit_id() or "unknown")
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("| tokens |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert len(cols) == len(set(cols)) and "scaling" not in cols, cols
    assert {(r["model"], r["tokens"]) for r in got["records"] if r.get("status") == "ok"} == {("orthros", 40)}
    # the CPU's peak memory is not measured: it was recorded (and tabled) as 0.0 GiB
    assert [r["peak_mem_gib"] for r in got["records"] if r.get("status") == "ok"] == [None]
    row = next(line for line in out.splitlines() if line.startswith("| 40 |"))
    assert [c.strip() for c in row.strip("|").split("|")][cols.index("mem/GPU 1 GPU (GiB)")] == "-"
    # the tiny model's size (it read '0.00 B params')
    assert re.search(r"model built \(\d+\.\d\d M params\)", out) and "0.00 B params" not in out, out


def test_bench_records_the_runs_the_time_budget_skipped(tmp_path, monkeypatch):
    """A run predicted to overrun ``--time-budget`` is skipped with a ``skipped`` record (log line and JSON)
    naming its prediction; it left no trace, so the results could not tell a skipped length from one never
    asked for."""
    import json

    from orthros.parallel import bench

    import orthros.utils as utils

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # (its cache, 32 GiB, need not fit the host: the run is skipped; unknown free memory is not checked)
    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: None)
    out = tmp_path / "b.json"
    # 64M tokens: predicted from the 40-token run, far past 60 s
    assert bench.main(["--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--lengths", "40,64M",
                       "--transformer", "", "--transformer-cp", "", "--warmup", "16", "--check-len", "20",
                       "--time-budget", "60", "--out", str(out)]) == 0
    recs = {(r["model"], r["tokens"]): r for r in json.loads(out.read_text())["records"] if "status" in r}
    assert recs[("orthros", 40)]["status"] == "ok"
    skipped = recs[("orthros", 64 << 20)]
    assert skipped["status"] == "skipped" and skipped["gpus"] == 1 and "--time-budget 60" in skipped["note"]


def test_bench_with_no_orthros_length_measured_prints_no_empty_table(tmp_path, monkeypatch, capsys):
    """With no Orthros length measured (``--lengths ''``, or every one skipped) the summary was a broken
    table ('|  |' and '|'); it says there is none."""
    from orthros.parallel import bench

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert bench.main(["--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--lengths", "", "--transformer", "",
                       "--transformer-cp", "", "--warmup", "16", "--check-len", "20",
                       "--out", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "|  |" not in out and "no Orthros length measured: no table" in out


def _prefill_each_rank_its_ids(ctx, model_dir, prompts):
    """(gloo worker) prefill ``prompts[i][rank]`` for each i; the error or the logits of each."""
    model = OrthrosForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for per_rank in prompts:
        try:
            out.append(ShardedOrthros(model, ctx).prefill(per_rank[ctx.rank])[0])
        except ValueError as e:
            out.append(str(e))
    return out


def test_ranks_with_different_prompts_are_refused_on_every_rank(model_dir):
    """Every rank must pass the same prompt. A different length gave each rank different logits
    without a word (the shards overlapped); a different batch aborted the processes inside gloo
    ('terminate called ... Received data size doesn't match'). Now every rank raises the same
    ValueError before any work, and the processes go on (here: with a sound prompt)."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(0, V, (2, 9), generator=g)
    b = a.clone()
    b[1, 2] = (b[1, 2] + 1) % V
    prompts = [(a[:, :8], a), (a[:1], a), (a, b), (a, a)]
    run = run_ranks(_prefill_each_rank_its_ids, 2, timeout_s=30, join_timeout=120, model_dir=model_dir,
                    prompts=prompts)
    assert not run["hung"] and not run["errors"], run["errors"]
    for r in range(2):
        got = run["results"][r]
        assert "input_ids differ across ranks" in got[0] and "[2, 8]" in got[0] and "[2, 9]" in got[0]
        assert "input_ids differ across ranks" in got[1] and "[1, 9]" in got[1]
        assert "input_ids differ across ranks" in got[2] and "same shape, other tokens" in got[2]
        assert isinstance(got[3], torch.Tensor)
    assert torch.equal(run["results"][0][3], run["results"][1][3])


def _prefill_each_rank_its_model(ctx, model_dir, changes):
    """(gloo worker) for each ``{rank: change}`` in ``changes``, this rank's model (the saved one, changed:
    ``window`` / ``layers`` / ``dtype`` / ``weights``) prefills the same prompt; the error or the logits."""
    ids = torch.arange(20).view(1, 20) % V
    out = []
    for per_rank in changes:
        change = per_rank.get(ctx.rank)
        kw = {"window_size": 5} if change == "window" else \
            {"num_hidden_layers": 2, "layer_types": ["orthros_attention"] * 2} if change == "layers" else {}
        model = OrthrosForCausalLM.from_pretrained(model_dir, dtype=torch.float64 if change == "dtype" else
                                                   torch.float32, **kw).eval()
        if change == "weights":  # one weight of the output stream's scale-offset, a little off
            with torch.no_grad():
                next(iter(model.model.layers[-1].self_attn.scale_offset_params().values())).view(-1)[0] += 1e-3
        try:
            out.append(ShardedOrthros(model, ctx).prefill(ids)[0])
        except ValueError as e:
            out.append(str(e))
    return out


def test_ranks_with_different_models_are_refused_on_every_rank(model_dir):
    """Every rank must hold the same model. Another window or dtype aborted the processes inside gloo
    ('terminate called ... Received data size doesn't match'; NCCL reads other sizes), another number of layers
    or other weights (random weights not seeded alike) gave other logits without a word. Now every rank raises
    the same ValueError before any work, and the processes go on."""
    changes = [{1: "window"}, {0: "layers"}, {1: "dtype"}, {0: "weights"}, {}]
    run = run_ranks(_prefill_each_rank_its_model, 2, timeout_s=30, join_timeout=120, model_dir=model_dir,
                    changes=changes)
    assert not run["hung"] and not run["errors"], run["errors"]
    for r in range(2):
        got = run["results"][r]
        assert "the model differs across ranks" in got[0] and "window 5" in got[0] and f"window {W}" in got[0]
        assert "the model differs across ranks" in got[1] and "rank 0: 2 layers" in got[1]
        assert "the model differs across ranks" in got[2] and "rank 1: 3 layers, window 12, hidden 48, float64" in got[2]
        assert "the model's weights differ across ranks" in got[3] and "seed every rank alike" in got[3]
        assert isinstance(got[4], torch.Tensor)
    assert torch.equal(run["results"][0][4], run["results"][1][4])


def test_the_model_check_reads_the_weights_again_only_after_they_change():
    """The weights' sum of squares (the cross-rank model check) is kept while no parameter was written to or
    replaced (a benchmark's timed prefills do not re-read 16 GB each), and computed again after a change
    (weights loaded after the ShardedOrthros was made must not be checked as the old ones)."""
    model = tiny_model()
    sh = ShardedOrthros(model)
    first = sh._model_key()[1]
    assert ShardedOrthros(model)._model_key()[1] is first  # another ShardedOrthros of the same model
    model.load_state_dict(tiny_model(seed=1).state_dict())
    loaded = sh._model_key()[1]
    assert float(loaded) == float(ShardedOrthros(tiny_model(seed=1))._model_key()[1]) != float(first)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * 2)
    assert float(sh._model_key()[1]) > float(loaded)
    # a cast keeps each Parameter and its version (Module._apply swaps p.data): the old weights' sum was kept
    cast = float(sh._model_key()[1])
    model.half()
    want = sum(float(p.detach().double().square().sum()) for p in model.parameters())
    assert float(sh._model_key()[1]) == pytest.approx(want, rel=1e-12) and want != pytest.approx(cast, rel=1e-9)


def test_a_cpu_model_over_nccl_is_refused_before_any_work(monkeypatch):
    """Under torchrun with NCCL, a model left on the CPU failed in the first gather, reported as 'a peer rank
    exited, crashed or did not arrive' (NCCL moves GPU tensors only)."""
    from orthros.parallel import comm

    monkeypatch.setattr(comm.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(comm.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(comm.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(comm.dist, "get_backend", lambda group=None: "nccl")
    with pytest.raises(ValueError, match=r"the model is on cpu, but the process group's backend is NCCL"):
        ShardedOrthros(tiny_model(), ParallelContext.from_group())
    monkeypatch.setattr(comm.dist, "get_backend", lambda group=None: "gloo")
    assert ShardedOrthros(tiny_model(), ParallelContext.from_group()).ctx.world_size == 2


def test_context_of_a_group_this_process_is_not_in_is_refused(monkeypatch):
    """``ParallelContext.from_group`` on a rank outside the group: torch answers rank -1 and
    world size -1, which gave a context ShardedOrthros failed on later with 'world_size must be
    an integer >= 1, got -1'."""
    from orthros.parallel import comm

    monkeypatch.setattr(comm.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(comm.dist, "get_rank", lambda group=None: 3 if group is None else -1)
    monkeypatch.setattr(comm.dist, "get_world_size", lambda group=None: 4 if group is None else -1)
    with pytest.raises(ValueError, match=r"\(global rank 3\) is not a member of the group"):
        ParallelContext.from_group(object())
    assert ParallelContext.from_group().rank == 3


@pytest.mark.parametrize("kw, match", [(dict(timeout_s=float("inf")), "timeout_s"), (dict(timeout_s=0), "timeout_s"),
                                       (dict(timeout_s=1e10), "timeout_s"), (dict(timeout_s=float("nan")), "timeout_s"),
                                       (dict(timeout_s="60"), "timeout_s"), (dict(backend="mpi"), "backend")])
def test_init_from_env_checks_its_arguments_on_one_process_too(kw, match, monkeypatch):
    """Bad arguments are refused wherever the script runs: without torchrun's environment they
    were ignored, and under it an infinite timeout was an OverflowError of timedelta on every rank."""
    from orthros.parallel import init_from_env

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=match):
        init_from_env(**kw)
    assert init_from_env(backend="gloo", timeout_s=5).world_size == 1


def test_init_from_env_refuses_another_backend_than_the_existing_group(monkeypatch):
    """Was: with a process group already up, init_from_env(backend="nccl") returned the gloo group's context,
    the backend asked for silently dropped (NCCL-only work then failed far from the cause)."""
    from orthros.parallel import comm, init_from_env

    monkeypatch.setattr(comm.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(comm.dist, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(comm.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(comm.dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(comm.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(comm.torch.cuda, "set_device", lambda i: None)
    with pytest.raises(ValueError, match="backend='nccl', but .*already initialised with 'gloo'"):
        init_from_env(backend="nccl")
    ctx = init_from_env(backend="gloo", timeout_s=5)
    assert ctx.world_size == 2 and ctx.timeout_s is None  # the group's own timeout, not 5 s, is what runs
    assert init_from_env().world_size == 2  # no backend asked: the group's


@pytest.mark.parametrize("kw, match", [(dict(rank=2, world_size=2), "rank"), (dict(rank=-1, world_size=2), "rank"),
                                       (dict(rank=0, world_size=0), "world_size"),
                                       (dict(rank=0, world_size=2.0), "world_size"),
                                       (dict(rank=0, world_size=2, timeout_s=datetime.timedelta(seconds=10)),
                                        "timeout_s"),
                                       (dict(rank=0, world_size=2, timeout_s="10"), "timeout_s"),
                                       (dict(rank=0, world_size=2, timeout_s=-1), "timeout_s")])
def test_hand_built_context_is_checked(kw, match):
    """A ParallelContext built by hand with a rank outside [0, world_size) or a non-integer world
    size: a ValueError naming the field (it failed in the first collective, 'Default process group
    has not been initialized', or as a TypeError of torch.empty). A timeout_s that is not seconds
    (a timedelta, as init_process_group takes, or a string) passed too, and the first failed
    collective's ParallelError was replaced by a TypeError of formatting it into the message."""
    with pytest.raises(ValueError, match=match):
        ParallelContext(**kw)


def _bench_with_a_slow_single_run(ctx, argv, slow_s):
    """(gloo worker) the benchmark's run with every 1-GPU Orthros measurement ``slow_s`` longer."""
    import time

    from orthros.parallel import bench

    orig = bench.Bench.orthros

    def orthros(self, T, run_ctx, label):
        if run_ctx.world_size == 1 and label == "measured":
            time.sleep(slow_s)
        return orig(self, T, run_ctx, label)

    bench.Bench.orthros = orthros
    b = bench.Bench(bench.parse_args(argv), ctx, torch.device("cpu"))
    b.run()
    return b.records


def test_bench_ranks_wait_out_a_1_gpu_run_longer_than_the_timeout(tmp_path):
    """While rank 0 measures a 1-GPU run the other ranks wait in a barrier; it ran under the
    collectives' --timeout, so a 1-GPU run longer than that stopped every rank ('collective
    after a 1-GPU run failed ... within the 3 s timeout') and the rest of the benchmark. The
    idle ranks now wait up to the time budget (a day without one)."""
    argv = ["--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--lengths", "40", "--transformer", "",
            "--transformer-cp", "", "--warmup", "16", "--check-len", "20", "--timeout", "3",
            "--out", str(tmp_path / "b.json")]
    run = run_ranks(_bench_with_a_slow_single_run, 2, timeout_s=3, join_timeout=120, argv=argv, slow_s=5)
    assert not run["hung"] and not run["errors"], run["errors"]
    got = {(r["model"], r["gpus"], r["tokens"], r["status"]) for r in run["results"][0] if "status" in r}
    assert got == {("orthros", 2, 40, "ok"), ("orthros", 1, 40, "ok")}


def _bench_with_argv_of_rank(ctx, argv_of_rank):
    """(gloo worker) the benchmark's run, each rank with its own arguments."""
    from orthros.parallel import bench

    b = bench.Bench(bench.parse_args(argv_of_rank[ctx.rank]), ctx, torch.device("cpu"))
    b.run()
    return b.records


def test_bench_ranks_given_different_arguments_stop_at_once_naming_the_options(tmp_path):
    """Ranks launched with different arguments (by hand, or a launcher passing each its own) ran their
    loops apart until a collective no longer matched and ran out the --timeout, each rank blaming a peer
    ('collective ... failed: a peer rank exited, crashed or did not arrive'). Now every rank stops before
    any work with a ValueError naming the options that differ; --out may differ (rank 0 alone writes it)."""
    base = ["--model", "tiny", "--dtype", "fp32", "--device", "cpu", "--transformer", "", "--transformer-cp", "",
            "--warmup", "16", "--check-len", "20", "--timeout", "10"]
    outs = [tmp_path / "r0.json", tmp_path / "r1.json"]
    argv = {0: base + ["--lengths", "40,48", "--out", str(outs[0])],
            1: base + ["--lengths", "40", "--out", str(outs[1])]}
    run = run_ranks(_bench_with_argv_of_rank, 2, timeout_s=10, join_timeout=120, argv_of_rank=argv)
    assert not run["hung"] and sorted(run["errors"]) == [0, 1], run
    for r, want in ((0, "[40, 48]"), (1, "[40]")):
        assert "ValueError: the ranks were given different arguments: --lengths (rank" in run["errors"][r]
        assert f"rank {r}: {want})" in run["errors"][r] and "--out" not in run["errors"][r].split("\n")[0]
    assert not any(o.exists() for o in outs)
    same = {r: base + ["--lengths", "40", "--out", str(outs[r])] for r in (0, 1)}  # only --out differs: runs
    run = run_ranks(_bench_with_argv_of_rank, 2, timeout_s=10, join_timeout=120, argv_of_rank=same)
    assert not run["errors"] and outs[0].exists() and not outs[1].exists(), run["errors"]


def _decode_steps_of_rank(ctx, model_dir, steps_of_rank):
    """(gloo worker) prefill two prompts (19 and 23 tokens) on every rank, then this rank's own decode steps
    ``[(token, cache)]`` (cache 0 or 1: the first prompt's or the second's); returns the last logits and the
    caches' positions."""
    model = OrthrosForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sh = ShardedOrthros(model, ctx, chunk_size=4)
    caches = [sh.prefill(torch.arange(1, 1 + T).view(1, -1) % V)[1] for T in (19, 23)]
    logits = None
    for tok, c in steps_of_rank[ctx.rank]:
        logits = sh.decode_step(torch.tensor([tok]), caches[c])
    return logits, [c.seq_len for c in caches]


@pytest.mark.parametrize("steps, match", [
    ({0: [(5, 0)], 1: [(6, 0)]}, r"tokens differ across ranks at position 19 \((rank 0: \[5\]|rank 1: \[6\])\)"),
    # rank 1 passed the other prompt's cache
    ({0: [(5, 0)], 1: [(5, 1)]}, r"the caches differ across ranks: rank 0 at position 19, rank 1 at position 23"),
])
def test_decode_step_refuses_ranks_out_of_step(model_dir, steps, match):
    """``decode_step`` on ranks passing different tokens (or caches at different positions) merged the
    partials of other queries: every rank returned logits, wrong, without a word (``prefill`` checks its prompt
    across ranks; ``generate`` broadcasts its tokens). Now every rank raises a ValueError, its cache untouched."""
    import re

    run = run_ranks(_decode_steps_of_rank, 2, timeout_s=30, join_timeout=120, model_dir=model_dir,
                    steps_of_rank=steps)
    assert not run["hung"] and sorted(run["errors"]) == [0, 1], run
    for r in (0, 1):
        assert "ValueError" in run["errors"][r] and re.search(match, run["errors"][r]), run["errors"][r]
    same = run_ranks(_decode_steps_of_rank, 2, timeout_s=30, join_timeout=120, model_dir=model_dir,
                     steps_of_rank={r: [(5, 0), (7, 1), (6, 0)] for r in (0, 1)})
    assert not same["errors"] and torch.equal(same["results"][0][0], same["results"][1][0])
    assert same["results"][0][1] == same["results"][1][1] == [21, 24]


def test_integer_and_seconds_arguments_take_numpy_and_0d_tensors_and_refuse_bools():
    """Issue: ShardedOrthros(reserve=) and ParallelContext(rank=, world_size=, timeout_s=) checked
    isinstance(..., int / float) where the rest of the library takes orthros.utils.as_int / as_float:
    reserve=np.int64(4), world_size=torch.tensor(1) or timeout_s=np.float32(5) were refused."""
    import numpy as np

    for reserve in (np.int64(4), torch.tensor(4)):
        sh = ShardedOrthros(tiny_model(), ParallelContext.single(), reserve=reserve)
        assert sh.reserve == 4 and type(sh.reserve) is int
    for bad in (True, np.True_, torch.tensor(True), 4.0, torch.tensor([4])):
        with pytest.raises(ValueError, match=r"^reserve must be an integer >= 0, got "):
            ShardedOrthros(tiny_model(), ParallelContext.single(), reserve=bad)
    ctx = ParallelContext(rank=np.int64(0), world_size=torch.tensor(1), timeout_s=np.float32(5))
    assert (ctx.rank, ctx.world_size, ctx.timeout_s) == (0, 1, 5.0)
    assert type(ctx.rank) is int and type(ctx.world_size) is int and type(ctx.timeout_s) is float
    assert ParallelContext(timeout_s=torch.tensor(2.5)).timeout_s == 2.5
    for kw, match in ((dict(rank=True), r"^rank must be an integer in \[0, world_size\) = \[0, 1\), got True"),
                      (dict(world_size=np.True_), r"^world_size must be an integer >= 1, got np.True_"),
                      (dict(timeout_s=True), r"^timeout_s must be a number of seconds > 0 and <= 1e\+09, got True")):
        with pytest.raises(ValueError, match=match):
            ParallelContext(**kw)


def test_bench_on_the_cpu_refuses_lengths_whose_cache_cannot_fit_before_any_work(tmp_path, monkeypatch, capsys):
    """Issue: `python -m orthros.parallel.bench --model tiny --device cpu --lengths 100M` built the model,
    ran the warm-up and the check, then was killed by the kernel mid-prefill (exit 137, no message): the
    100M-token KV cache (25 GiB) did not fit the host. On CUDA an OOM is a recorded result; on the CPU
    the lengths are now sized against the free memory up front, naming the option."""
    import orthros.utils as utils
    from orthros.parallel import bench

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 64 << 20)
    monkeypatch.setattr(bench, "init_from_env", lambda *a, **k: pytest.fail("the process group was started"))
    monkeypatch.setattr(bench.os, "_exit", lambda code: pytest.fail(f"os._exit({code}): the run started"))
    monkeypatch.setenv("WORLD_SIZE", "2")
    base = ["--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "b.json"), "--transformer-cp", ""]
    for args, says in ((["--lengths", "1K,1M"], "--lengths: a prompt of 1048576 tokens needs at least 256.6 MiB of "
                                                 "host memory, more than the 64.0 MiB free: the weights of 2 ranks "
                                                 "take 547.0 KiB and the KV cache 256.1 MiB; a prompt of at most "
                                                 "259700 tokens fits (activations not counted)"),
                       (["--lengths", "1K", "--extra-lengths", "1M"], "--extra-lengths: a prompt of 1048576 tokens"),
                       (["--lengths", "1K", "--layers", "100000"], "no prompt fits beside the weights")):
        with pytest.raises(SystemExit) as e:
            bench.main(base + args)
        assert e.value.code == 2
        assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert bench.parse_args(base + ["--lengths", "64K"]).lengths == [65536]  # 16 MiB of cache: fits
    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: None)  # unknown: not checked
    assert bench.parse_args(base + ["--lengths", "1M"]).lengths == [1 << 20]


def test_bench_counts_the_parameters_without_building_every_layer(monkeypatch):
    """The host-memory check counted the weights on a meta-device model of every layer: ``--layers 100000`` built
    100000 layers (~1.5 ms each, minutes before the usage error). They are counted on models of 1 and 2 layers,
    exactly: the same figure as the whole model's."""
    import orthros.models as models
    from orthros.parallel import bench

    for name, layers in (("tiny", None), ("tiny", 7), ("qwen3-8b", 3)):
        cfg = bench.model_config(name, layers)
        with torch.device("meta"):
            assert bench.count_parameters(cfg) == sum(p.numel() for p in OrthrosForCausalLM(cfg).parameters())
    built = []

    def counted(cfg):
        built.append(cfg.num_hidden_layers)
        return OrthrosForCausalLM(cfg)

    monkeypatch.setattr(models, "OrthrosForCausalLM", counted)
    big = bench.count_parameters(bench.model_config("tiny", 100000))
    assert built and max(built) <= 2, built
    one, two = (bench.count_parameters(bench.model_config("tiny", n)) for n in (1, 2))
    assert big == one + 99999 * (two - one)


def test_bench_host_memory_check_counts_this_hosts_ranks_and_is_decided_once_a_host(tmp_path, monkeypatch, capsys):
    """Issue: every torchrun rank measured the free memory itself (at its own moment: near the limit one rank
    refused while the others ran on) and counted all WORLD_SIZE ranks' weights and the whole cache as if every
    rank were on this host (a 2-host run was refused what fit). Now LOCAL_RANK 0 decides for its host, counting
    LOCAL_WORLD_SIZE ranks' weights and their shards of the cache."""
    import orthros.utils as utils
    from orthros.parallel import bench

    monkeypatch.setattr(utils, "available_memory", lambda device, **kw: 64 << 20)
    base = ["--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "b.json"), "--transformer-cp", ""]
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # 2 hosts of 4 ranks would be 4; here 4 hosts of 2
    assert bench.parse_args(base + ["--lengths", "512K"]).lengths == [1 << 19]  # 2 shards of 64K here: 32 MiB
    with pytest.raises(SystemExit) as e:
        bench.parse_args(base + ["--lengths", "4M"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--lengths: a prompt of 4194304 tokens needs at least 256.6 MiB of host memory, more than the 64.0 MiB " \
           "free: the weights of 2 ranks (of 8) on this host take 547.0 KiB and the KV cache 256.1 MiB; a prompt of " \
           "at most 1038800 tokens fits" in err, err
    for bad in ("0", "9", "x"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(SystemExit):
            bench.parse_args(base + ["--lengths", "1K"])
        assert f"environment variable LOCAL_WORLD_SIZE is '{bad}': it must be an integer in [1, 8]" \
            in capsys.readouterr().err
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # unset: every rank on this host
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # not the host's deciding rank: no check of its own
    assert bench.parse_args(base + ["--lengths", "1M"]).lengths == [1 << 20]
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit):
        bench.parse_args(base + ["--lengths", "1M"])
