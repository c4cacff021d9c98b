"""``orthros generate`` end to end on a tiny checkpoint written to disk and loaded back."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from orthros.cli import main as orthros_main
from orthros.engine import Engine
from orthros.models import OrthrosForCausalLM

from conftest import checkpoint_missing, interrupted_at

WORDS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(95)]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    from test_engine import tiny_model

    d = tmp_path_factory.mktemp("ckpt")
    m = tiny_model()
    m.config.eos_token_id = 0
    m.save_pretrained(d)
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", unk_token="<unk>").save_pretrained(d)
    return d, m


def run_cli(argv, stdin=""):
    out, old_out, old_in = io.StringIO(), sys.stdout, sys.stdin
    sys.stdout, sys.stdin = out, io.StringIO(stdin)
    try:
        rc = orthros_main(argv)
    finally:
        sys.stdout, sys.stdin = old_out, old_in
    return rc, out.getvalue()


def test_generate_streams_the_engine_tokens(checkpoint):
    d, m = checkpoint
    torch.set_num_threads(1)
    prompt = "w1 w5 w7 w9 w11 w13"
    rc, text = run_cli(["generate", "--model", str(d), "--max-new-tokens", "8", "--device", "cpu", prompt])
    assert rc == 0
    ids = [WORDS.index(w) for w in prompt.split()]
    want = Engine(m, max_seq_len=64).generate([ids], 8, eos_token_id=0)[0]
    assert text.split() == [WORDS[i] for i in want if i > 1]


def test_generate_interactive_continues_the_conversation(checkpoint):
    d, m = checkpoint
    rc, text = run_cli(["generate", "--model", str(d), "--max-new-tokens", "4", "--device", "cpu", "--interactive"],
                       stdin="w1 w2 w3\nw4 w5\n")
    assert rc == 0
    lines = text.strip("\n").split("\n")
    assert len(lines) == 2
    eng = Engine(m, max_seq_len=64)
    t1 = [WORDS.index(w) for w in "w1 w2 w3".split()]
    g1 = eng.generate([t1], 4, eos_token_id=0)[0]
    g2 = eng.generate([[WORDS.index("w4"), WORDS.index("w5")]], 4, eos_token_id=0, continue_=True)[0]
    assert lines[0].split() == [WORDS[i] for i in g1 if i > 1]
    assert lines[1].split() == [WORDS[i] for i in g2 if i > 1]


class _TTYInput(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [True, False])
def test_generate_interactive_prompts_at_a_terminal(checkpoint, capsys, monkeypatch, tty):
    """Issue 17 #9: interactive chat showed no prompt between turns. At a terminal, "> " goes to
    stderr before every turn (stdout keeps only the generated text); piped input gets none."""
    d, _ = checkpoint
    stdin = "w1 w2 w3\nw4 w5\n"
    monkeypatch.setattr(sys, "stdin", _TTYInput(stdin) if tty else io.StringIO(stdin))
    rc = orthros_main(["generate", "--model", str(d), "--max-new-tokens", "4", "--device", "cpu", "--interactive"])
    cap = capsys.readouterr()
    assert rc == 0
    assert cap.err.count("> ") == (3 if tty else 0)  # before turn 1, turn 2, and the end of input
    assert "> " not in cap.out and len(cap.out.strip("\n").split("\n")) == 2


@pytest.mark.parametrize("tty", [True, False])
def test_a_prompt_read_from_a_terminal_is_asked_for(checkpoint, capsys, monkeypatch, tty):
    """No prompt argument at a terminal: stderr says the prompt is read from stdin and how to end it
    (was: the command waited without a word, as if hung). Piped stdin gets no such line."""
    d, _ = checkpoint
    monkeypatch.setattr(sys, "stdin", _TTYInput("w1 w2 w3\n") if tty else io.StringIO("w1 w2 w3\n"))
    rc = orthros_main(["generate", "--model", str(d), "--max-new-tokens", "4", "--device", "cpu"])
    cap = capsys.readouterr()
    assert rc == 0 and len(cap.out.split()) > 0
    assert ("reading the prompt from stdin; end it with Ctrl-D" in cap.err) == tty


@pytest.mark.parametrize("flag, value", [("--temperature", "-1"), ("--top-p", "2"), ("--top-k", "-3"),
                                         ("--max-new-tokens", "0"), ("--dtype", "int8")])
def test_generate_rejects_bad_arguments(flag, value, capsys):
    assert orthros_main(["generate", "--model", "/nonexistent", flag, value, "hi"]) == 2
    assert flag.lstrip("-").replace("-", "_").split("_")[0] in capsys.readouterr().err.replace("-", "_")


@pytest.mark.parametrize("flags", [["--top-k", "5"], ["--top-p", "0.9"], ["--temperature", "0", "--top-k", "5"]])
def test_generate_refuses_sampling_filters_when_greedy(flags, capsys):
    """--top-k / --top-p without --temperature > 0 asked for sampling and got greedy text."""
    assert orthros_main(["generate", "--model", "/nonexistent", *flags, "hi"]) == 2
    err = capsys.readouterr().err
    assert "--temperature 0 (the default) is greedy" in err and "/nonexistent" not in err
    assert orthros_main(["generate", "--model", "/nonexistent", "--temperature", "0.7", *flags[-2:], "hi"]) == 2
    assert "greedy" not in capsys.readouterr().err  # sampling: the filters pass, the model path is what fails


def test_generate_reports_prompt_too_long(checkpoint, capsys):
    """In the command's option names (was: the engine's, "max_seq_len=4 ... build the engine with a
    larger max_seq_len", which no user of the command can do as said)."""
    d, _ = checkpoint
    rc = orthros_main(["generate", "--model", str(d), "--device", "cpu", "--max-seq-len", "4",
                       "w1 w2 w3 w4 w5 w6"])
    err = capsys.readouterr().err
    assert rc == 2 and "the prompt: 6 prompt tokens + 256 new tokens need 261 cache slots > " \
        "--max-seq-len 4; shorten the prompt, lower --max-new-tokens or raise --max-seq-len" in err, err
    assert "max_seq_len" not in err and "max_new_tokens" not in err and "build the engine" not in err


def test_interactive_turn_too_long_is_said_in_option_names(checkpoint, capsys):
    """A turn that does not fit the conversation's cache is reported with the command's options and
    the conversation's tokens so far (was: "row 0: 5 cached + 13 new prompt tokens ... > max_seq_len=12;
    ... lower max_new_tokens or build the engine with a larger max_seq_len": the engine's names, and the
    reply's last token counted in the user's turn); the conversation goes on with the next turn, and
    once no turn can fit any more, the error says so."""
    d, m = checkpoint
    argv = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "3", "--max-seq-len", "12",
            "--interactive"]
    rc, text = run_cli(argv, stdin="w1 w2 w3\n" + "w4 " * 12 + "\nw5\nw6\n")
    err = capsys.readouterr().err
    eng = Engine(m, max_seq_len=12)
    g1 = eng.generate([[WORDS.index(w) for w in "w1 w2 w3".split()]], 3, eos_token_id=0)[0]
    g2 = eng.generate([[WORDS.index("w5")]], 3, eos_token_id=0, continue_=True)[0]
    n1, n2 = 3 + len(g1), 3 + len(g1) + 1 + len(g2)
    assert rc == 0 and f"this turn: {n1} tokens so far + 12 of the new turn + 3 new tokens need {n1 + 14} cache " \
        "slots > --max-seq-len 12; shorten the prompt, lower --max-new-tokens or raise --max-seq-len (up to the " \
        "model's max_position_embeddings=512)\n" in err, err
    assert n2 + 3 > 12 and f"this turn: {n2} tokens so far + 1 of the new turn + 3 new tokens need {n2 + 3} cache " \
        "slots > --max-seq-len 12; shorten the prompt, lower --max-new-tokens or raise --max-seq-len (up to the " \
        "model's max_position_embeddings=512) (the conversation has no room left for another turn)" in err, err
    assert "max_seq_len" not in err and "max_new_tokens" not in err and "row 0" not in err
    assert [line.split() for line in text.strip("\n").split("\n")] == \
        [[WORDS[i] for i in g if i > 1] for g in (g1, g2)]


@pytest.mark.parametrize("stdin", [None, "  \n"])
def test_generate_refuses_a_prompt_of_no_tokens_before_loading(checkpoint, capsys, monkeypatch, stdin):
    """Was: a prompt (argument or stdin) that encodes to no tokens loaded the weights, generated
    nothing and exited 0 with no output; --prompts refuses such a prompt (exit 2), so does this."""
    d, _ = checkpoint
    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the weights were loaded"))
    capsys.readouterr()
    argv = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2"]
    rc, text = run_cli(argv + ["   "] if stdin is None else argv, stdin=stdin or "")
    err = capsys.readouterr().err
    assert rc == 2 and text == "" and "the prompt encodes to no tokens" in err, err


def test_generate_compile_flag_gives_the_same_text(checkpoint):
    d, _ = checkpoint
    torch.set_num_threads(1)
    argv = ["generate", "--model", str(d), "--max-new-tokens", "6", "--device", "cpu", "w3 w8 w2 w9"]
    rc, plain = run_cli(argv)
    rc2, compiled = run_cli(argv[:1] + ["--compile"] + argv[1:])
    assert rc == rc2 == 0 and compiled == plain


def test_generate_gemv_flag_reaches_the_engine_and_gives_the_same_text(checkpoint, monkeypatch):
    """No flag leaves the engine's default (``None``: on for CUDA), --gemv builds Engine(gemv=True),
    --no-gemv Engine(gemv=False) (on a CPU the GEMV op runs the same ops unfused, so the text is
    the plain engine's); the two flags together are refused."""
    from orthros.engine import engine as engine_mod  # the CLI imports Engine from it at call time

    d, _ = checkpoint
    torch.set_num_threads(1)
    seen = []
    real = engine_mod.Engine

    def spy(*args, **kw):
        seen.append(kw.get("gemv"))
        return real(*args, **kw)

    monkeypatch.setattr(engine_mod, "Engine", spy)
    argv = ["generate", "--model", str(d), "--max-new-tokens", "6", "--device", "cpu", "w3 w8 w2 w9"]
    rc, plain = run_cli(argv)
    rc2, fused = run_cli(argv[:1] + ["--gemv"] + argv[1:])
    rc3, unfused = run_cli(argv[:1] + ["--no-gemv"] + argv[1:])
    assert rc == rc2 == rc3 == 0 and fused == plain == unfused and seen == [None, True, False]
    with pytest.raises(SystemExit) as e:
        run_cli(argv[:1] + ["--gemv", "--no-gemv"] + argv[1:])
    assert e.value.code == 2


def test_generate_stats_line_on_stderr(checkpoint, capsys):
    """--stats: one timings line a turn on stderr; stdout keeps only the text."""
    d, _ = checkpoint
    rc, text = run_cli(["generate", "--model", str(d), "--max-new-tokens", "5", "--device", "cpu", "--stats",
                        "w1 w5 w7"])
    assert rc == 0 and "[stats]" not in text
    err = capsys.readouterr().err
    assert err.count("[stats] 3 prompt tokens, first new token after ") == 1, err


def test_turn_stats_figures():
    from orthros.engine.cli import turn_stats

    assert turn_stats(7, 0, 1.0, None, None) == "[stats] 7 prompt tokens, no new token"
    assert turn_stats(1, 0, 1.0, None, None) == "[stats] 1 prompt token, no new token"  # (was "1 prompt tokens")
    assert turn_stats(7, 1, 1.0, 1.25, 1.25) == "[stats] 7 prompt tokens, first new token after 250.0 ms"
    assert turn_stats(7, 5, 1.0, 1.25, 1.45) == ("[stats] 7 prompt tokens, first new token after 250.0 ms; "
                                                 "5 new tokens, decode 20.0 tokens/s (50.00 ms a step)")


def test_generate_a_file_of_prompts_in_batches(checkpoint, tmp_path, capsys):
    """--prompts: each prompt's completion is what the engine gives it alone (greedy), in the
    file's order, whatever the batch; .txt and .jsonl alike; stdout or --output."""
    import json

    d, m = checkpoint
    prompts = ["w1 w5 w7", "w2", "w9 w8 w7 w6 w5", "w3 w3", "w11 w12 w13"]
    (tmp_path / "p.txt").write_text("\n".join(prompts[:2]) + "\n\n" + "\n".join(prompts[2:]) + "\n")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate(prompts)))
    eng = Engine(m, max_seq_len=64)
    want = []
    for p in prompts:
        new = eng.generate([[WORDS.index(w) for w in p.split()]], 6, eos_token_id=0)[0]
        want.append(" ".join(WORDS[i] for i in new if i > 1))
    out = tmp_path / "o" / "out.jsonl"
    rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "6", "--prompts",
                        str(tmp_path / "p.txt"), "--batch-size", "2", "-o", str(out)])
    assert rc == 0 and text == ""
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in recs] == prompts
    assert [r["completion"].split() for r in recs] == [w.split() for w in want]
    assert all(r["finish"] == ("eos" if r["new_tokens"] < 6 else "length") for r in recs)
    assert [p.name for p in out.parent.iterdir()] == ["out.jsonl"]  # no temporary left
    rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "6", "--prompts",
                        str(tmp_path / "p.jsonl"), "--batch-size", "3"])
    assert rc == 0 and [json.loads(line)["completion"] for line in text.splitlines()] == [r["completion"] for r in recs]


def test_a_prompts_file_by_a_quoted_tilde_path_and_an_upper_case_suffix(checkpoint, tmp_path, capsys, monkeypatch):
    """``--prompts '~/P.TXT'`` (a ``~`` the shell left, a suffix in capitals): was "no such file" (the
    ``~`` not expanded, as it is for --model) and then "a .txt ... is needed"."""
    d, _ = checkpoint
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "P.TXT").write_text("w1 w5\nw2\n")
    rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2", "--prompts",
                        "~/P.TXT"])
    assert rc == 0 and [__import__("json").loads(x)["prompt"] for x in text.splitlines()] == ["w1 w5", "w2"], text


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_prompt_file_run_stopped_early_keeps_its_finished_batches(checkpoint, tmp_path, capsys, monkeypatch, stop):
    """Ctrl-C (or a failure) in the third batch: the two finished batches' lines are on stdout
    (streamed), or, with --output, in OUTPUT.partial, and --output is not written. Was: all lost."""
    import json

    from orthros.engine.engine import Engine as Eng

    d, _ = checkpoint
    prompts = ["w1 w5 w7", "w2", "w9 w8 w7 w6 w5", "w3 w3", "w11 w12 w13"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    argv = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "4", "--prompts",
            str(tmp_path / "p.txt"), "--batch-size", "2"]
    out = tmp_path / "o" / "out.jsonl"
    rc, _ = run_cli(argv + ["-o", str(out)])
    assert rc == 0
    whole = out.read_text().splitlines(keepends=True)
    out.unlink()
    real, calls = Eng.generate, []

    def generate(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise stop("stopped in the third batch")
        return real(self, *a, **kw)

    monkeypatch.setattr(Eng, "generate", generate)
    capsys.readouterr()
    code = 130 if stop is KeyboardInterrupt else 1
    rc, text = run_cli(argv)
    assert rc == code and text.splitlines(keepends=True) == whole[:4]
    calls.clear()
    rc, text = run_cli(argv + ["-o", str(out)])
    assert rc == code and text == ""
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl.partial"]  # nor a temporary
    assert (out.parent / "out.jsonl.partial").read_text().splitlines(keepends=True) == whole[:4]
    assert "stopped after 4 of 5 prompts" in capsys.readouterr().err


def test_a_stopped_prompt_file_run_says_what_it_kept_and_leaves_no_stale_partial(checkpoint, tmp_path, capsys,
                                                                                   monkeypatch):
    """Streamed to stdout, a stopped run says how many prompts' lines are there (stdout may be a file
    the user reads later). With --output, OUTPUT.partial is only ever the latest run's: a run that
    completes removes an earlier run's (the whole file replaces it), and a run stopped before any
    batch finished says the one there is an earlier run's. Was: silent; a stale OUTPUT.partial stayed
    beside the whole file, looking like this run's."""
    from orthros.engine.engine import Engine as Eng

    d, _ = checkpoint
    (tmp_path / "p.txt").write_text("w1 w5 w7\nw2\nw9 w8 w7\n")
    argv = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "3", "--prompts",
            str(tmp_path / "p.txt"), "--batch-size", "1"]
    out, partial = tmp_path / "out.jsonl", tmp_path / "out.jsonl.partial"
    real, calls = Eng.generate, []

    def stop_at(n):
        calls.clear()

        def generate(self, *a, **kw):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(self, *a, **kw)
        monkeypatch.setattr(Eng, "generate", generate)

    stop_at(3)
    capsys.readouterr()
    rc, text = run_cli(argv)
    assert rc == 130 and len(text.splitlines()) == 2
    assert "stopped after 2 of 3 prompts: their lines are on stdout" in capsys.readouterr().err
    stop_at(3)
    rc, _ = run_cli(argv + ["-o", str(out)])
    assert rc == 130 and len(partial.read_text().splitlines()) == 2 and not out.exists()
    stop_at(1)  # nothing finished: the partial there is the earlier run's, and said so
    capsys.readouterr()
    rc, _ = run_cli(argv + ["-o", str(out)])
    assert rc == 130 and len(partial.read_text().splitlines()) == 2 and not out.exists()
    assert f"stopped after 0 of 3 prompts; {partial} is of an earlier run" in capsys.readouterr().err
    stop_at(0)  # runs to its end
    rc, _ = run_cli(argv + ["-o", str(out)])
    assert rc == 0 and len(out.read_text().splitlines()) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "p.txt"]
    assert f"removed {partial}" in capsys.readouterr().err


def test_paths_with_a_tilde_are_the_home_s(checkpoint, tmp_path, monkeypatch):
    """The shell leaves ``~`` in ``--model=~/x`` as it is. Was: --model passed the checks (which
    expanded it), then loading failed on the literal path (exit 1, a hub repo-id error); --output
    was checked at home but written to ``./~/``; --prompts was "no such file"."""
    import shutil

    d, _ = checkpoint
    shutil.copytree(d, tmp_path / "ckpt")
    (tmp_path / "p.txt").write_text("w1 w2\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    rc, text = run_cli(["generate", "--model=~/ckpt", "--device", "cpu", "--max-new-tokens", "2", "w1"])
    assert rc == 0 and text.strip()
    rc, _ = run_cli(["generate", "--model=~/ckpt", "--device", "cpu", "--max-new-tokens", "2", "--prompts=~/p.txt",
                     "--output=~/out/o.jsonl"])
    assert rc == 0 and (tmp_path / "out" / "o.jsonl").is_file() and not (tmp_path / "~").exists()


def test_prompt_file_finish_with_the_model_configs_list_of_eos_ids(tmp_path):
    """A tokenizer without an EOS token: generation stops at any of the model config's
    ``eos_token_id`` list, and such a row's record says ``finish: eos``."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from test_engine import tiny_model

    m = tiny_model()
    free = Engine(m, max_seq_len=16).generate([[2, 3]], 6)[0]
    m.config.eos_token_id = [0, free[2]]
    m.save_pretrained(tmp_path)
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>").save_pretrained(tmp_path)
    (tmp_path / "p.txt").write_text("w0 w1\n")  # token ids [2, 3]
    rc, text = run_cli(["generate", "--model", str(tmp_path), "--device", "cpu", "--max-new-tokens", "6",
                        "--prompts", str(tmp_path / "p.txt")])
    rec = json.loads(text)
    assert rc == 0 and (rec["new_tokens"], rec["finish"]) == (free.index(free[2]) + 1, "eos")


def test_generate_prompt_file_errors_before_any_work(checkpoint, tmp_path, capsys):
    d, _ = checkpoint
    good = tmp_path / "p.txt"
    good.write_text("w1 w2\n")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "w1"}\n{"text": "w2"}\n')
    (tmp_path / "torn.jsonl").write_text('{"prompt": "w1"\n')
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "p.csv").write_text("w1\n")
    (tmp_path / "long.txt").write_text("w1 " * 70 + "\n")
    out = tmp_path / "never.jsonl"
    base = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "4"]
    for extra, says in ((["--prompts", str(tmp_path / "none.txt")], "no such file"),
                        (["--prompts", str(tmp_path)], "a folder, not a file"),  # was: "no such file"
                        (["--prompts", str(tmp_path / "p.csv")], "a .txt (one prompt a line) or a .jsonl"),
                        (["--prompts", str(tmp_path / "bad.jsonl")], "bad.jsonl:2: a JSON object"),
                        (["--prompts", str(tmp_path / "torn.jsonl")], "torn.jsonl:1: not JSON"),
                        (["--prompts", str(tmp_path / "empty.txt")], "no prompt in the file"),
                        (["--prompts", str(good), "w1"], "--prompts replaces the prompt argument"),
                        (["--prompts", str(good), "--interactive"], "--prompts replaces the prompt argument"),
                        (["w1", "-o", str(out)], "--output goes with --prompts"),
                        (["--prompts", str(good), "-o", str(tmp_path)], "is a directory"),
                        (["--prompts", str(good), "--batch-size", "0"], "--batch-size must be >= 1"),
                        (["--prompts", str(tmp_path / "long.txt"), "--max-seq-len", "32"], "long.txt:1: 70 prompt tokens + 4 new "
                         "tokens need 73 cache slots > --max-seq-len 32; shorten the prompt, lower "
                         "--max-new-tokens or raise --max-seq-len")):
        rc, text = run_cli(base + extra + ([] if "-o" in extra else ["-o", str(out)]))
        err = capsys.readouterr().err
        assert rc == 2 and says in err, (extra, err)
        assert text == "" and not out.exists()


@pytest.mark.parametrize("extra", [["w1"], ["--interactive"]])
def test_generate_batch_size_goes_with_prompts(checkpoint, capsys, extra):
    """Was: --batch-size without --prompts was accepted and ignored (one prompt runs one row)."""
    d, _ = checkpoint
    rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2",
                        "--batch-size", "4", *extra], stdin="w1\n")
    err = capsys.readouterr().err
    assert rc == 2 and text == "" and "--batch-size goes with --prompts" in err, err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_generate_prompt_file_on_cuda_matches_each_prompt_alone(checkpoint, tmp_path):
    """--prompts on CUDA (CUDA graphs, fp32 so that batch-size rounding cannot flip an argmax):
    five prompts in batches of three, so the last batch has fewer rows than the engine was built
    for; each greedy completion equals the one the CLI gives that prompt alone."""
    import json

    d, _ = checkpoint
    prompts = ["w1 w5 w7", "w2", "w9 w8 w7 w6 w5", "w3 w3", "w11 w12 w13"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    base = ["generate", "--model", str(d), "--device", "cuda", "--dtype", "fp32", "--max-new-tokens", "6"]
    rc, text = run_cli(base + ["--prompts", str(tmp_path / "p.txt"), "--batch-size", "3"])
    assert rc == 0
    got = [json.loads(line)["completion"].split() for line in text.splitlines()]
    for p, g in zip(prompts, got):
        rc, alone = run_cli(base + [p])
        assert rc == 0 and alone.split() == g, p


def test_generate_refuses_a_config_eos_id_outside_the_vocabulary_before_loading(tmp_path, monkeypatch, capsys):
    """config.json's EOS id past the model's vocabulary (a tokenizer or config that is not the
    model's) would never stop a row: refused with where it came from, before the weights load."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from test_engine import tiny_model

    m = tiny_model()
    m.config.eos_token_id = m.config.vocab_size + 3
    m.save_pretrained(tmp_path)
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>").save_pretrained(tmp_path)

    def refuse(*a, **kw):
        raise AssertionError("the model was loaded before the bad EOS id was refused")

    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained", refuse)
    rc, text = run_cli(["generate", "--model", str(tmp_path), "--device", "cpu", "--max-new-tokens", "2",
                        "w0 w1"])
    err = capsys.readouterr().err
    assert rc != 0 and text == ""
    assert f"config.json's eos_token_id {m.config.vocab_size + 3} is outside the model's vocabulary" in err


def test_generate_refuses_a_checkpoint_missing_a_tensor_before_loading(checkpoint, tmp_path, monkeypatch, capsys):
    """A checkpoint without one of its model's tensors would generate from a random one: refused,
    naming the tensor, before the weights load."""
    d, _ = checkpoint
    holed = checkpoint_missing(d, tmp_path / "holed", "model.norm.weight")

    def refuse(*a, **kw):
        raise AssertionError("the model was loaded before the missing tensor was named")

    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained", refuse)
    rc, text = run_cli(["generate", "--model", str(holed), "--device", "cpu", "--max-new-tokens", "2", "w1 w2"])
    assert rc == 2 and text == ""
    assert "the weights do not fit its config.json: missing model.norm.weight" in capsys.readouterr().err


def test_prompt_file_lines_end_at_newlines_only(checkpoint, tmp_path):
    """One prompt a line means a line of the file: a form feed, U+0085 or U+2028 inside a prompt
    (raw in JSON written with ensure_ascii=False, as this command writes its own records) is part of
    it. Was: ``str.splitlines`` split there (a .txt prompt became two, a .jsonl line "not JSON")."""
    import json

    d, _ = checkpoint
    inner = ["w1\x0cw2", "w3\x85w4", "w5\u2028w6"]
    (tmp_path / "p.txt").write_text("\n".join(inner) + "\r\nw7\n", encoding="utf-8")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in inner),
                                      encoding="utf-8")
    base = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2", "--prompts"]
    for name, want in (("p.txt", inner + ["w7"]), ("p.jsonl", inner)):
        rc, text = run_cli(base + [str(tmp_path / name)])
        assert rc == 0 and [json.loads(line)["prompt"] for line in text.split("\n")[:-1]] == want, (name, text)


def test_prompt_file_output_dash_is_stdout(checkpoint, tmp_path, monkeypatch):
    """``-o -`` is stdout, as for most tools (and as without ``-o``). Was: the records went to a file
    named ``-`` in the working directory, and stdout stayed empty."""
    import json

    d, _ = checkpoint
    (tmp_path / "p.txt").write_text("w1 w2\nw3\n")
    monkeypatch.chdir(tmp_path)
    rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2",
                        "--prompts", "p.txt", "-o", "-"])
    assert rc == 0 and [json.loads(line)["prompt"] for line in text.splitlines()] == ["w1 w2", "w3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.txt"]


def test_prompt_file_with_a_byte_order_mark(checkpoint, tmp_path):
    """A file saved with a UTF-8 byte order mark (Windows editors): was, in a .txt, part of the
    first prompt (its first word became another token, the record's prompt began with U+FEFF); a
    .jsonl was refused as "not JSON". The mark is not text: both read as without it."""
    import json

    d, _ = checkpoint
    (tmp_path / "p.txt").write_bytes(b"\xef\xbb\xbfw1 w2\nw3\n")
    (tmp_path / "p.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"prompt": p}) + "\n"
                                                                   for p in ("w1 w2", "w3")).encode())
    base = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2", "--prompts"]
    (tmp_path / "plain.txt").write_text("w1 w2\nw3\n")
    rc, want = run_cli(base + [str(tmp_path / "plain.txt")])
    assert rc == 0 and json.loads(want.split("\n")[0])["prompt"] == "w1 w2"
    for name in ("p.txt", "p.jsonl"):
        assert run_cli(base + [str(tmp_path / name)]) == (0, want), name


def test_generate_drops_stdin_trailing_newline(checkpoint, tmp_path):
    """Was: `echo PROMPT | orthros generate` kept the newline `echo` adds, so the model was asked to
    continue after a line break and gave another text than `orthros generate PROMPT`. With a
    tokenizer that keeps newlines (here: words split on spaces only, "w5\\n" unknown) the two differ."""
    d, _ = checkpoint
    argv = ["generate", "--model", str(d), "--tokenizer", str(space_split_tokenizer(tmp_path)), "--max-new-tokens",
            "6", "--device", "cpu"]
    rc_arg, from_argv = run_cli(argv + ["w1 w5 w7 w9"])
    rc_in, from_stdin = run_cli(argv, stdin="w1 w5 w7 w9\n\n")
    assert rc_arg == rc_in == 0
    assert from_stdin == from_argv


def space_split_tokenizer(tmp_path):
    """The checkpoint's words split on spaces only (a line break or CR stays in its word, which is
    then unknown): a directory for --tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    tok_dir = tmp_path / "tok"
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    t.decoder = decoders.WordPiece(prefix="##")
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", unk_token="<unk>").save_pretrained(tok_dir)
    return tok_dir


def test_interactive_turns_end_at_crlf_as_at_lf(checkpoint, tmp_path):
    """Was: a turn piped with Windows line ends kept its CR (only the LF was dropped), so the model
    was asked to continue after a CR ("w5\\r" an unknown word here) and gave another text than the
    same turns with LF line ends; the first prompt read from stdin and --prompts drop both."""
    d, _ = checkpoint
    argv = ["generate", "--model", str(d), "--tokenizer", str(space_split_tokenizer(tmp_path)), "--max-new-tokens",
            "4", "--device", "cpu", "--interactive"]
    rc_lf, lf = run_cli(argv, stdin="w1 w5\nw7 w9\n")
    rc_crlf, crlf = run_cli(argv, stdin="w1 w5\r\nw7 w9\r\n")
    assert rc_lf == rc_crlf == 0 and len(lf.split("\n")) == 3
    assert crlf == lf


def test_plain_interactive_turns_are_lines_of_one_text(checkpoint, tmp_path, monkeypatch):
    """Without --chat each later line continues the text after the reply, as the terminal shows it:
    the reply, then the line end typed, then the line. Was: the line's tokens right after the reply's
    ('...the mat.Then it slept'), the line end dropped."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    import orthros.engine.engine as E

    d, _ = checkpoint
    words = WORDS[:2] + ["\n"] + WORDS[3:]  # id 2 is the line end here
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", behavior="isolated"),
                                               pre_tokenizers.Split(" ", behavior="removed")])
    t.decoder = decoders.WordPiece(prefix="##")
    tok_dir = tmp_path / "tok"
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", unk_token="<unk>").save_pretrained(tok_dir)
    seen, real = [], E.Engine.stream

    def stream(self, prompts, *a, **kw):
        seen.append(list(prompts[0]))
        return real(self, prompts, *a, **kw)

    monkeypatch.setattr(E.Engine, "stream", stream)
    rc, _ = run_cli(["generate", "--model", str(d), "--tokenizer", str(tok_dir), "--max-new-tokens", "3",
                     "--device", "cpu", "--interactive"], stdin="w4 w5\nw7 w9\n")
    ids = {w: words.index(w) for w in ("w4", "w5", "w7", "w9")}
    assert rc == 0 and seen == [[ids["w4"], ids["w5"]], [2, ids["w7"], ids["w9"]]]


def test_output_that_is_the_prompt_file_is_refused_before_any_work(checkpoint, tmp_path, capsys):
    """Was: ``--prompts p.jsonl -o p.jsonl`` (or a link to it) ran every prompt, then replaced the
    prompts with the records: the input was lost. Refused up front, the file left as it was."""
    d, _ = checkpoint
    p = tmp_path / "p.txt"
    p.write_text("w1 w2\n")
    (tmp_path / "link.txt").symlink_to(p)
    for out in (p, tmp_path / "link.txt", tmp_path / "." / "p.txt"):
        rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "2",
                            "--prompts", str(p), "-o", str(out)])
        err = capsys.readouterr().err
        assert rc == 2 and text == "" and "--output" in err and "is the --prompts file" in err, err
        assert p.read_text() == "w1 w2\n"


def test_a_prompt_file_error_names_the_prompt_s_line(checkpoint, tmp_path, capsys):
    """Was: a prompt too long for the cache was "row 2", one with no tokens or out of the model's
    vocabulary "prompt 2": its place among the prompts, not the file's line (blank lines are
    skipped), and "row" 1-based where the engine's rows are 0-based. Now FILE:LINE, as the file's
    other errors."""
    import json

    d, _ = checkpoint
    (tmp_path / "long.txt").write_text("w1\n\n" + "w1 " * 70 + "\n")
    (tmp_path / "blank.jsonl").write_text(json.dumps({"prompt": "w1"}) + "\n\n" + json.dumps({"prompt": " "}) + "\n")
    for name, says in (("long.txt", "long.txt:3: 70 prompt tokens + 4 new tokens"),
                       ("blank.jsonl", "blank.jsonl:3: the prompt encodes to no tokens")):
        rc, text = run_cli(["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "4",
                            "--max-seq-len", "32", "--prompts", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert rc == 2 and text == "" and says in err, err


def test_a_seeded_prompt_file_draws_afresh_in_every_batch(checkpoint, tmp_path):
    """--seed with --prompts: reproducible, and each batch draws its own numbers. Was: every batch
    reseeded the generator with --seed, so a prompt repeated down the file (N samples of it) got the
    same completion in every batch (--batch-size 1: N copies of one sample)."""
    import json

    d, _ = checkpoint
    (tmp_path / "p.txt").write_text("w1 w2\n" * 4)
    argv = ["generate", "--model", str(d), "--device", "cpu", "--max-new-tokens", "6", "--temperature", "1",
            "--seed", "0", "--prompts", str(tmp_path / "p.txt"), "--batch-size", "1"]
    rc, text = run_cli(argv)
    assert rc == 0
    got = [json.loads(line)["completion"] for line in text.splitlines()]
    assert len(set(got)) == 4, got
    assert run_cli(argv) == (0, text)  # the same seed, the same file: the same text
    rc, alone = run_cli(argv[:9] + ["--seed", "0", "w1 w2"])  # the first batch draws as a single prompt does
    assert rc == 0 and alone.split() == got[0].split()


def _heavy_after(code: str) -> list:
    """The heavy modules (torch, transformers, numpy) a fresh interpreter holds after ``code``."""
    import json
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    code += "\nimport sys, json\nprint(json.dumps([m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]))"
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["--model", "x", "--top-p", "2", "hi"],
                                  ["--model", "x", "--top-k", "3", "hi"], ["--model", "x", "--max-new-tokens", "0"],
                                  ["--model", "x", "--top-k", "zz"]])
def test_help_and_argument_errors_import_no_torch(argv):
    """``orthros generate --help`` took ~5 s of CPU: ``orthros.engine`` (the package of its CLI) imported
    the engine, torch and transformers, and SamplingParams' checks of the sampling options torch."""
    code = ("import contextlib, io\nfrom orthros.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            f"    try:\n        assert main(['generate', *{argv!r}]) == 2\n    except SystemExit as e:\n"
            "        assert e.code in (0, 2)")
    assert _heavy_after(code) == []


def test_help_names_every_default():
    """Each option with a default value says it in --help (was: --prefill-chunk did not)."""
    from orthros.engine.cli import build_parser

    for a in build_parser()._actions:
        if a.default not in (None, False, "==SUPPRESS==") and a.option_strings:
            default = a.default if not isinstance(a.default, float) else f"{a.default:g}"
            assert str(default) in a.help, (a.option_strings, a.help)


def test_sampling_params_from_the_package_import_no_torch():
    """``from orthros.engine import SamplingParams`` registered the engine first (models, torch, transformers)
    though SamplingParams needs neither."""
    assert _heavy_after("from orthros.engine import SamplingParams\nSamplingParams(temperature=0.5, top_k=3)") == []


def test_engine_imported_before_the_models_still_serves_generate():
    """The package loads its names on first use; imported before the models, generate(use_engine=True)
    still finds the engine (was registered only by the package's import)."""
    code = ("import orthros.engine.cli\nimport torch\nfrom orthros.models import OrthrosConfig, OrthrosForCausalLM\n"
            "import orthros.models.modeling_orthros as mo\n"
            "m = OrthrosForCausalLM(OrthrosConfig(vocab_size=50, hidden_size=32, intermediate_size=64, "
            "num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, window_size=4, "
            "max_position_embeddings=32)).eval()\n"
            "ids = torch.tensor([[1, 2, 3]])\n"
            "assert torch.equal(m.generate(ids, max_new_tokens=4, use_engine=True), "
            "m.generate(ids, max_new_tokens=4, use_engine=False))\n"
            "assert mo._GENERATE_BACKEND is not None\n"
            "from orthros.engine import Engine, SamplingParams, StaticKVCache\n"
            "import orthros.engine as e\nassert e.Engine is Engine and 'Engine' in dir(e)")
    assert "torch" in _heavy_after(code)


@pytest.fixture(scope="module")
def hybrid_checkpoint(tmp_path_factory, checkpoint):
    """An Orthros-H checkpoint (GDN layers: a state that cannot be rewound) with the same tokenizer."""
    import shutil

    from test_engine_hybrid import tiny

    d = tmp_path_factory.mktemp("hybrid")
    m = tiny("orthros-h")
    m.config.eos_token_id = 0
    m.save_pretrained(d)
    for f in checkpoint[0].iterdir():
        if "token" in f.name:
            shutil.copy(f, d / f.name)
    return d, m


@pytest.mark.parametrize("kind", ["attention", "hybrid"])
@pytest.mark.parametrize("where", ["step", "write", "yield"])
def test_ctrl_c_during_an_interactive_reply_stops_the_reply_only(checkpoint, hybrid_checkpoint, monkeypatch, capsys,
                                                                  kind, where):
    """Was: Ctrl-C while a reply streamed ended the whole --interactive session (exit 130). Now it
    stops that reply: the tokens shown stay in the conversation (as a reply cut by --max-new-tokens),
    stderr says so, and the next line is a turn after them. Ctrl-C inside decode step 2 ("step": one
    token shown), while the 2nd token prints ("write": two), or as the 2nd token arrives, before it
    is shown ("yield": one). The engine's conversation goes on where it holds just the tokens shown;
    else (a hybrid model cut inside a step: a GDN state cannot be rewound; a token the engine gave
    but the screen never showed) the next turn runs the conversation shown again from its tokens."""
    import orthros.engine.cli as cli
    import orthros.engine.engine as E

    d, m = checkpoint if kind == "attention" else hybrid_checkpoint
    writes = []

    class Out(io.StringIO):
        def write(self, text):
            writes.append(text)
            if where == "write" and len(writes) == 2:
                raise KeyboardInterrupt
            return super().write(text)

    if where == "step":  # the 3rd sample: inside decode step 2, after the first token was shown
        monkeypatch.setattr(E, "sample", interrupted_at(E.sample, 3))
    elif where == "yield":
        monkeypatch.setattr(cli._TextStream, "push", interrupted_at(cli._TextStream.push, 2))
    calls, real = [], E.Engine.stream

    def stream(self, prompts, *a, continue_=False, **k):
        calls.append((list(prompts[0]), continue_))
        return real(self, prompts, *a, continue_=continue_, **k)

    monkeypatch.setattr(E.Engine, "stream", stream)
    out = Out()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stdin", io.StringIO("w1 w2 w3\nw4 w5\n"))
    rc = orthros_main(["generate", "--model", str(d), "--max-new-tokens", "6", "--device", "cpu", "--interactive",
                       "--max-seq-len", "64"])
    err = capsys.readouterr().err
    assert rc == 0, err
    lines = out.getvalue().split("\n")
    assert len(lines) == 3 and lines[2] == "" and "[stopped: the reply so far stays in the conversation]" in err
    t1, t2 = [WORDS.index(w) for w in "w1 w2 w3".split()], [WORDS.index(w) for w in "w4 w5".split()]
    full = Engine(m, max_seq_len=64).generate([t1], 6, eos_token_id=0)[0]
    kept = full[:2 if where == "write" else 1]
    assert len(full) > 2 and lines[0].split() == [WORDS[i] for i in kept if i > 1]
    want = Engine(m, max_seq_len=64).generate([t1 + kept + t2], 6, eos_token_id=0)[0]
    assert lines[1].split() == [WORDS[i] for i in want if i > 1]
    again = where == "yield" or kind == "hybrid" and where == "step"  # the conversation shown, run again
    assert calls[1] == ((t1 + kept + t2, False) if again else (t2, True))


@pytest.mark.parametrize("at", [1, 3])
def test_ctrl_c_during_a_single_reply_ends_its_line(checkpoint, monkeypatch, capsys, at):
    """Was: Ctrl-C while a (non-interactive) reply streamed left stdout without its line end, so the shell's prompt
    (or "orthros generate: interrupted" on a terminal) ran on after the text. The text so far ends its line, as a
    finished reply's does (nothing shown yet: no empty line); exit 130."""
    import orthros.engine.engine as E

    d, m = checkpoint
    monkeypatch.setattr(E, "sample", interrupted_at(E.sample, at))  # the 1st: before any token; the 3rd: after one
    rc, text = run_cli(["generate", "--model", str(d), "--max-new-tokens", "6", "--device", "cpu", "w1 w2 w3"])
    assert rc == 130 and "orthros generate: interrupted" in capsys.readouterr().err
    full = Engine(m, max_seq_len=64).generate([[WORDS.index(w) for w in "w1 w2 w3".split()]], 6, eos_token_id=0)[0]
    shown = [WORDS[i] for i in full[:1] if i > 1]  # (the step after a token is queued before it is shown)
    assert (text == "") if at == 1 else (text.endswith("\n") and text.split() == shown), (text, shown)


def test_ctrl_c_before_an_interactive_reply_drops_the_turn(checkpoint, monkeypatch, capsys):
    """Ctrl-C before a reply's first token (in the prefill, or before its first token is sampled)
    drops that turn: stderr says so, and the next line is a turn of the conversation without it
    (here the first: a fresh start). Ctrl-C at the prompt still ends the session (exit 130)."""
    import orthros.engine.engine as E

    d, m = checkpoint
    monkeypatch.setattr(E, "sample", interrupted_at(E.sample, 1))
    rc, text = run_cli(["generate", "--model", str(d), "--max-new-tokens", "4", "--device", "cpu", "--interactive",
                        "--max-seq-len", "64"], stdin="w1 w2 w3\nw4 w5\n")
    err = capsys.readouterr().err
    assert rc == 0 and "[stopped: the turn is dropped]" in err, err
    lines = text.split("\n")
    want = Engine(m, max_seq_len=64).generate([[WORDS.index("w4"), WORDS.index("w5")]], 4, eos_token_id=0)[0]
    assert lines[0] == "" and lines[1].split() == [WORDS[i] for i in want if i > 1] and len(lines) == 3

    class CtrlC(io.StringIO):
        def readline(self, *a):
            raise KeyboardInterrupt

    monkeypatch.setattr(sys, "stdin", CtrlC())
    assert orthros_main(["generate", "--model", str(d), "--max-new-tokens", "4", "--device", "cpu", "--interactive",
                         "--max-seq-len", "64"]) == 130
    assert "orthros generate: interrupted" in capsys.readouterr().err
