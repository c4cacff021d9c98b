"""Positions beyond ``max_position_embeddings`` (issue 17.5): the engine refuses such a request
before any work; the HF model computes it with a warning (transformers' convention), and
``model.generate()`` does not route such a request to the engine."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from orthros.engine import Engine
from orthros.engine.engine import check_fits
from orthros.models import OrthrosConfig, OrthrosForCausalLM

MPE = 24


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return OrthrosForCausalLM(OrthrosConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=1, window_size=4,
                                            max_position_embeddings=MPE, attn_backend="reference")).eval()


def test_engine_refuses_a_cache_beyond_the_positions(model):
    """A cache row longer than the model's positions is refused when the engine is built, naming
    max_seq_len and the limit (was: built, and set_lengths() + step() ran past the positions
    without a word); the default cache is no longer than the positions."""
    with pytest.raises(ValueError, match=re.escape(f"max_seq_len={MPE + 1} exceeds the model's "
                                                   f"max_position_embeddings={MPE}")):
        Engine(model, max_seq_len=MPE + 1)
    assert Engine(model, max_seq_len=MPE).max_seq_len == MPE
    assert Engine(model).max_seq_len == MPE  # min(4096, max_position_embeddings)


def test_engine_refuses_a_request_beyond_the_positions(model):
    eng = Engine(model, max_seq_len=MPE)
    with pytest.raises(ValueError, match=f"max_position_embeddings={MPE}"):
        eng.generate([list(range(MPE + 1))], 1)
    with pytest.raises(ValueError, match=rf"need positions 0\.\.{MPE}, beyond"):
        eng.generate([list(range(MPE - 3))], 5)  # the prompt fits, prompt + new tokens do not
    assert eng.batch_size == 0  # nothing ran
    assert len(eng.generate([list(range(MPE - 3))], 4)[0]) == 4  # exactly MPE positions: fine
    eng.generate([list(range(MPE - 6))], 2)
    with pytest.raises(ValueError, match=f"max_position_embeddings={MPE}"):  # a continuation counts the cache
        eng.generate([[1, 2, 3, 4, 5]], 3, continue_=True)


def test_a_continuation_too_long_counts_the_pending_token_in_the_conversation(model):
    """The last reply's last token (pending: fed with the next turn) is the conversation's, not the new
    turn's (was: "row 0: 6 cached + 10 new prompt tokens" for a turn of 9)."""
    eng = Engine(model, max_seq_len=16)
    assert len(eng.generate([[1, 2, 3]], 4)[0]) == 4 and eng.lengths() == [6]  # 3 + 3 fed, 1 pending
    with pytest.raises(ValueError, match=re.escape("row 0: 7 tokens so far + 9 of the new turn + 2 new tokens need "
                                                   "17 cache slots > max_seq_len=16")):
        eng.generate([[5] * 9], 2, continue_=True)
    assert eng.lengths() == [6] and len(eng.generate([[5] * 8], 2, continue_=True)[0]) == 2  # 16 slots: fits


def test_check_fits_names_positions_before_cache_slots():
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        check_fits(0, 9, 1, max_seq_len=4, max_positions=8)
    with pytest.raises(ValueError, match="max_seq_len=4"):
        check_fits(0, 5, 1, max_seq_len=4, max_positions=8)
    check_fits(2, 3, 4, max_seq_len=8, max_positions=8)


def test_check_fits_error_can_be_said_in_a_front_end_s_names():
    """The error keeps what it measured: a front end (the CLI) says it with its own option names,
    for the cache and for the positions alike; the engine's names by default."""
    from orthros.engine.engine import RequestTooLong

    names = {"max_seq_len": "--max-seq-len {}", "max_new_tokens": "--max-new-tokens",
             "more_slots": "raise --max-seq-len (up to {max_positions})"}
    with pytest.raises(RequestTooLong, match=re.escape("lower max_new_tokens or build the engine with a larger "
                                                       "max_seq_len")) as e:
        check_fits(3, 5, 2, max_seq_len=8, max_positions=16, row=1)
    assert e.value.phrased(names, where="this turn") == (
        "this turn: 3 tokens so far + 5 of the new turn + 2 new tokens need 9 cache slots > --max-seq-len 8; shorten "
        "the prompt, lower --max-new-tokens or raise --max-seq-len (up to 16)")
    assert str(e.value).startswith("row 1: 3 tokens so far")
    with pytest.raises(ValueError, match=re.escape("beyond the model's max_position_embeddings=8; shorten the "
                                                   "prompt or lower --max-new-tokens")):
        check_fits(0, 9, 1, max_seq_len=4, max_positions=8, names=names)


def test_request_too_long_is_a_public_name():
    """docs/engine.md names the engine's length error ``RequestTooLong`` for callers to catch; it was only
    in ``orthros.engine.engine`` (``from orthros.engine import RequestTooLong`` was an ImportError)."""
    import orthros.engine
    from orthros.engine.engine import RequestTooLong

    assert orthros.engine.RequestTooLong is RequestTooLong and "RequestTooLong" in orthros.engine.__all__
    m = OrthrosForCausalLM(OrthrosConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, window_size=4,
                                         max_position_embeddings=16))
    with pytest.raises(orthros.engine.RequestTooLong):
        Engine(m, max_seq_len=8).generate([[1, 2, 3]], 8)


def _position_warnings(rec):
    return [w for w in rec if "max_position_embeddings" in str(w.message)]


def test_model_forward_warns_and_computes(model):
    ids = torch.randint(0, 50, (1, MPE + 2))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = model(ids[:, :MPE]).logits
    assert not _position_warnings(rec)
    with pytest.warns(UserWarning, match=f"beyond max_position_embeddings={MPE}"):
        with torch.no_grad():
            longer = model(ids).logits
    assert torch.isfinite(longer).all() and longer.shape[1] == MPE + 2
    torch.testing.assert_close(longer[:, :MPE], out)  # causal: the first MPE positions are unchanged


def test_generate_warns_through_transformers_and_the_engine_declines(model, caplog):
    """transformers' generate warns itself (its max-length reminder names max_position_embeddings)."""
    import logging

    import transformers.utils.logging  # noqa: F401  (defines Logger.warning_once)

    logging.Logger.warning_once.cache_clear()  # shown once per process: make it this test's
    ids = torch.randint(0, 50, (1, MPE - 2))
    with caplog.at_level("WARNING"):
        out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == MPE + 3
    assert f"predefined maximum length ({MPE})" in caplog.text
    with pytest.raises(ValueError, match=f"max_position_embeddings={MPE}"):
        model.generate(ids, max_new_tokens=5, do_sample=False, use_engine=True)
