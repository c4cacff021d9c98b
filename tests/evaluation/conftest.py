"""Fixtures shared by the evaluation tests."""

import pytest


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: bad input must be refused before the weights load."""
    import orthros.evaluation.common as common

    def refuse(*a, **kw):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(common, "load_model", refuse)
