"""``orthros generate --chat`` (and ``--system``) on a tiny checkpoint with the shipped ChatML
tokenizer: the text is the engine's greedy reply to the chat-templated prompt, a later turn runs
only its new tokens, and the system message opens every conversation."""

from __future__ import annotations

import io
import json
import sys

import pytest
import torch

from orthros.cli import main as orthros_main
from orthros.engine import Engine
from orthros.evaluation.common import make_tiny_checkpoint
from conftest import interrupted_at  # at the top: tests/serving/conftest.py is `conftest` once collected


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("chat") / "ckpt", max_position_embeddings=512)


@pytest.fixture(scope="module")
def model_and_tok(ckpt):
    from transformers import AutoTokenizer

    from orthros.models import OrthrosForCausalLM

    return OrthrosForCausalLM.from_pretrained(str(ckpt)).eval(), AutoTokenizer.from_pretrained(str(ckpt))


def run(argv, stdin=""):
    out, old_out, old_in = io.StringIO(), sys.stdout, sys.stdin
    sys.stdout, sys.stdin = out, io.StringIO(stdin)
    try:
        rc = orthros_main(["generate", *argv])
    finally:
        sys.stdout, sys.stdin = old_out, old_in
    return rc, out.getvalue()


def chat_ids(tok, messages):
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def stops(tok):
    """What ends a --chat reply: EOS and the template's end of turn."""
    return [tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")]


def reply(model, tok, ids, n=6):
    new = Engine(model, max_seq_len=256).generate([ids], n, eos_token_id=stops(tok))[0]
    return tok.decode(new, skip_special_tokens=True)



def fed_prompts(monkeypatch) -> list:
    """The token ids of row 0 of each engine ``stream`` call the CLI makes, in order."""
    fed, real = [], Engine.stream

    def spy(self, prompts, *a, **k):
        fed.append(list(prompts[0]))
        return real(self, prompts, *a, **k)

    monkeypatch.setattr(Engine, "stream", spy)
    return fed

@pytest.mark.parametrize("system", [None, "Answer in one word."])
def test_chat_reply_is_the_engines_reply_to_the_templated_prompt(ckpt, model_and_tok, system):
    model, tok = model_and_tok
    torch.set_num_threads(1)
    sys_args = ["--system", system] if system else []
    rc, text = run(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "6", "--chat", *sys_args,
                    "What is the capital of France?"])
    assert rc == 0
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": "What is the capital of France?"}]
    ids = chat_ids(tok, messages)
    assert ("Answer in one word." in tok.decode(ids)) == bool(system)
    assert text == reply(model, tok, ids) + "\n"


def test_interactive_chat_keeps_the_system_message_and_the_history(ckpt, model_and_tok):
    model, tok = model_and_tok
    torch.set_num_threads(1)
    rc, text = run(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "4", "--chat", "--interactive",
                    "--system", "Be brief."], stdin="Hello there\nAnd again\n")
    assert rc == 0
    lines = text.split("\n")
    # turn 1 from the opening [system, user]; turn 2 continues the same cache with the template's new tokens
    m1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    ids1 = chat_ids(tok, m1)
    eng = Engine(model, max_seq_len=256)
    new1 = eng.generate([ids1], 4, eos_token_id=stops(tok))[0]
    assert lines[0] == tok.decode(new1, skip_special_tokens=True)
    m2 = m1 + [{"role": "assistant", "content": tok.decode(new1, skip_special_tokens=True)},
               {"role": "user", "content": "And again"}]
    full, history = chat_ids(tok, m2), ids1 + new1
    assert full[:len(history)] == history  # (a reply that does not re-tokenize: the test below)
    turn2 = full[len(history):]
    new2 = eng.generate([turn2], 4, eos_token_id=stops(tok), continue_=True)[0]
    assert lines[1] == tok.decode(new2, skip_special_tokens=True)


def test_a_file_of_prompts_with_a_system_message(ckpt, model_and_tok, tmp_path):
    model, tok = model_and_tok
    torch.set_num_threads(1)
    f = tmp_path / "p.txt"
    f.write_text("Hello\nWhat is two and two?\n")
    out = tmp_path / "out.jsonl"
    rc, _ = run(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "5", "--chat", "--system", "Be kind.",
                 "--prompts", str(f), "-o", str(out)])
    assert rc == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    for rec, prompt in zip(recs, ["Hello", "What is two and two?"]):
        ids = chat_ids(tok, [{"role": "system", "content": "Be kind."}, {"role": "user", "content": prompt}])
        assert rec["prompt"] == prompt and rec["completion"] == reply(model, tok, ids, 5)


def test_system_without_chat_is_refused(ckpt, capsys):
    assert orthros_main(["generate", "--model", str(ckpt), "--system", "Be brief.", "hi"]) == 2
    assert "--system goes with --chat" in capsys.readouterr().err


# SmolLM2-Instruct's template (docs/pretrained.md): a default system message when the first is not one
DEFAULT_SYSTEM = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                  "{{ '<|im_start|>system\nYou are SmolLM.<|im_end|>\n' }}{% endif %}"
                  "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.mark.parametrize("template", ["shipped", "default system"])
def test_a_turn_after_a_reply_that_does_not_retokenize_closes_the_reply(ckpt, tmp_path, monkeypatch, template):
    """A reply whose text encodes to other tokens than the ones generated (here one cut inside a
    character: U+FFFD) cannot be found at the start of the re-rendered conversation. Was: every
    later turn then fed only the template of its own user message: the reply's end of turn
    (``<|im_end|>\\n``) was never in the cache, and a template with a default system message put
    one in the middle of the conversation at every turn. Now the turn is what the template
    renders after the reply."""
    import shutil

    from transformers import AutoTokenizer

    d = ckpt
    if template != "shipped":
        d = shutil.copytree(ckpt, tmp_path / "ck")
        (d / "chat_template.jinja").write_text(DEFAULT_SYSTEM)
    tok = AutoTokenizer.from_pretrained(str(d))
    fed = fed_prompts(monkeypatch)
    torch.set_num_threads(1)
    rc, text = run(["--model", str(d), "--device", "cpu", "--max-new-tokens", "5", "--chat", "--interactive",
                    "--system", "Sys"], stdin="Hello\nHow are you\nok\n")
    assert rc == 0 and "\ufffd" in text.split("\n")[1]  # the second reply does not re-tokenize
    turn3 = tok("<|im_end|>\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n",
                add_special_tokens=False)["input_ids"]
    assert len(fed) == 3 and fed[2] == turn3, tok.decode(fed[2])


def test_an_end_of_turn_the_model_generated_is_not_repeated(model_and_tok):
    """After a reply that does not re-tokenize but ended with the template's end-of-turn token
    (a special token the model generated), the next turn starts after it."""
    from orthros.engine.cli import _after_reply

    _, tok = model_and_tok
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]
    rest = tok("<|im_end|>\n<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n",
               add_special_tokens=False)["input_ids"]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert rest[0] == end
    assert _after_reply(tok, messages, [7, 8]) == rest
    assert _after_reply(tok, messages, [7, end]) == rest[1:]


@pytest.fixture
def stop_ids(monkeypatch):
    """The stop ids of every generation the engine runs (``Engine.stream``; generate() runs through it),
    one sorted list a call."""
    from orthros.engine import engine as engine_mod

    seen, real = [], engine_mod.Engine.stream

    def stream(self, *a, eos_token_id=None, **k):
        seen.append(sorted(engine_mod._eos_set(eos_token_id, 10 ** 6)))
        return real(self, *a, eos_token_id=eos_token_id, **k)

    monkeypatch.setattr(engine_mod.Engine, "stream", stream)
    return seen


def test_chat_replies_end_at_the_template_s_end_of_turn(ckpt, tmp_path, stop_ids):
    """SFT teaches a reply to end with the token the chat template closes it with (ChatML's
    ``<|im_end|>``), which is not the shipped tokenizer's EOS (``<|endoftext|>``). Was: --chat
    stopped at EOS only, so a reply ran on through ``<|im_end|>`` into made-up turns up to
    --max-new-tokens. Now --chat also stops there; plain prompts stop at EOS only."""
    (tmp_path / "p.txt").write_text("Hello\n")
    base = ["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "2"]
    for extra in (["hi"], ["--interactive"], ["--prompts", str(tmp_path / "p.txt")]):
        stop_ids.clear()
        assert run(base + extra, stdin="hi\n")[0] == 0 and stop_ids == [[0]], (extra, stop_ids)
        stop_ids.clear()
        assert run(base + ["--chat"] + extra, stdin="hi\n")[0] == 0 and stop_ids == [[0, 3]], (extra, stop_ids)


def test_generation_config_stop_ids_end_a_generation(ckpt, tmp_path, stop_ids, capsys):
    """transformers' generate stops at every id of the checkpoint's generation_config.json (Llama 3 Instruct
    lists three); `orthros generate` stopped at the tokenizer's EOS alone. Ids outside the vocabulary, or of
    another type, are refused before the weights load."""
    import shutil

    ck = shutil.copytree(ckpt, tmp_path / "ck")
    gen = json.loads((ck / "generation_config.json").read_text())
    base = ["--model", str(ck), "--device", "cpu", "--max-new-tokens", "2", "hi"]
    for ids, want in (([0, 5, 7], [0, 5, 7]), (6, [0, 6])):
        (ck / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": ids}))
        stop_ids.clear()
        assert run(base)[0] == 0 and stop_ids == [want], (ids, stop_ids)
    for bad, match in (([0, 10 ** 7], "outside the model's vocabulary"), ("x", "a token id or a list")):
        (ck / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": bad}))
        stop_ids.clear()
        capsys.readouterr()
        rc, err = run(base)[0], capsys.readouterr().err
        assert rc == 2 and match in err and "generation_config.json" in err and not stop_ids, (bad, err)


def test_generation_config_stop_ids_of_a_model_path_with_a_tilde(ckpt, tmp_path, stop_ids, monkeypatch):
    """``--model "~/x"`` (quoted, or from a variable: the shell leaves the ``~``) is the home folder's
    checkpoint. Was: the checks and the loading expanded it, but its generation_config.json was looked
    for at the literal path, so its stop ids were dropped without a word (the run went on past them)."""
    import shutil

    ck = shutil.copytree(ckpt, tmp_path / "ck")
    gen = json.loads((ck / "generation_config.json").read_text())
    (ck / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [0, 5, 7]}))
    monkeypatch.setenv("HOME", str(tmp_path))
    rc, _ = run(["--model", "~/ck", "--device", "cpu", "--max-new-tokens", "2", "hi"])
    assert rc == 0 and stop_ids == [[0, 5, 7]], stop_ids


def test_a_reply_cut_inside_a_character_prints_all_its_text(ckpt, model_and_tok, monkeypatch):
    """The streamed text holds back a character whose bytes have not all come (U+FFFD at the end of
    the decoded text). Was: a turn that ended there (--max-new-tokens reached) never printed it, so
    the text differed from the reply's decoded tokens (what --prompts writes and the chat history
    keeps); the end of a turn now prints what is left."""
    from orthros.engine import engine as engine_mod

    _, tok = model_and_tok
    new = tok("日本", add_special_tokens=False)["input_ids"][:4]  # 日 and the first byte of 本
    assert tok.decode(new).endswith("\ufffd")

    def stream(self, prompts, *a, **k):
        yield from ([t] for t in new)

    monkeypatch.setattr(engine_mod.Engine, "stream", stream)
    rc, text = run(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "4", "Hello"])
    assert rc == 0 and text == tok.decode(new, skip_special_tokens=True) + "\n"


NO_SYSTEM = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
             "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
             "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.mark.parametrize("prompts", [False, True])
def test_a_chat_template_that_refuses_the_system_message(ckpt, tmp_path, capsys, monkeypatch, prompts):
    """A template that raises for a conversation (Gemma's and Mistral's refuse a system message).
    Was: exit 1 (a runtime failure) with jinja's "TemplateError: ..." and no word of the option;
    now bad input (exit 2) naming --chat / --system and the template's reason, before the weights load."""
    import shutil

    from orthros.models import OrthrosForCausalLM

    d = shutil.copytree(ckpt, tmp_path / "ck")
    (d / "chat_template.jinja").write_text(NO_SYSTEM)
    (tmp_path / "p.txt").write_text("Hello\n")
    monkeypatch.setattr(OrthrosForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("the weights were loaded"))
    capsys.readouterr()
    rc, text = run(["--model", str(d), "--device", "cpu", "--chat", "--system", "Be brief.",
                    *(["--prompts", str(tmp_path / "p.txt")] if prompts else ["Hello"])])
    err = capsys.readouterr().err
    assert rc == 2 and text == "" and "--chat" in err and "System role not supported" in err, err


def test_an_empty_system_message_is_a_system_message(ckpt, tmp_path, monkeypatch):
    """``--system ""`` asks for an empty system message, which is how a template with a default
    one (SmolLM2's "You are SmolLM.") is told to leave it out. Was: dropped as if not given, so the
    default came back."""
    import shutil

    from transformers import AutoTokenizer

    d = shutil.copytree(ckpt, tmp_path / "ck")
    (d / "chat_template.jinja").write_text(DEFAULT_SYSTEM)
    tok = AutoTokenizer.from_pretrained(str(d))
    fed = fed_prompts(monkeypatch)
    rc, _ = run(["--model", str(d), "--device", "cpu", "--max-new-tokens", "2", "--chat", "--system", "", "Hello"])
    assert rc == 0 and fed == [chat_ids(tok, [{"role": "system", "content": ""}, {"role": "user", "content": "Hello"}])]
    assert "You are SmolLM" not in tok.decode(fed[0])


@pytest.mark.parametrize("cut", [1, 3])
def test_ctrl_c_in_a_chat_reply_keeps_the_messages_in_step(ckpt, model_and_tok, monkeypatch, capsys, cut):
    """Ctrl-C during an --interactive --chat reply stops that reply only (was: it ended the session).
    Stopped after its first token (the 3rd sample), the reply so far is the assistant message the
    next turn's template renders after; stopped before it (the 1st sample), the user turn is dropped
    from the messages too, so the next turn is rendered without it (no two user turns in a row)."""
    import orthros.engine.engine as E

    model, tok = model_and_tok
    torch.set_num_threads(1)
    monkeypatch.setattr(E, "sample", interrupted_at(E.sample, cut))
    fed, got, real = [], [], E.Engine.stream

    def stream(self, prompts, *a, **k):
        fed.append(list(prompts[0]))
        got.append([])
        for step in real(self, prompts, *a, **k):
            got[-1].append(step[0])
            yield step

    monkeypatch.setattr(E.Engine, "stream", stream)
    rc, text = run(["--model", str(ckpt), "--device", "cpu", "--max-new-tokens", "4", "--chat", "--interactive",
                    "--system", "Be brief."], stdin="Hello there\nAnd again\n")
    err = capsys.readouterr().err
    assert rc == 0 and len(fed) == 2, err
    system = {"role": "system", "content": "Be brief."}
    if cut == 1:
        assert "[stopped: the turn is dropped]" in err and got[0] == []
        assert fed[1] == chat_ids(tok, [system, {"role": "user", "content": "And again"}])
    else:
        assert "[stopped: the reply so far stays in the conversation]" in err and len(got[0]) == 1
        shown = tok.decode(got[0], skip_special_tokens=True)
        assert text.split("\n")[0] == shown
        m2 = [system, {"role": "user", "content": "Hello there"}, {"role": "assistant", "content": shown},
              {"role": "user", "content": "And again"}]
        rendered = tok.apply_chat_template(m2, add_generation_prompt=True, tokenize=False)
        assert tok.decode(fed[0] + got[0] + fed[1]) == rendered
    assert text.split("\n")[1] == tok.decode(got[1], skip_special_tokens=True)
