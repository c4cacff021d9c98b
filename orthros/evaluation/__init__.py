"""Evaluations of Orthros models (paper Section 4.4): multi-query associative recall (MQAR),
needle-in-a-haystack, lm-evaluation-harness, and the ``orthros demo``. See docs/evaluation.md.

The names below load on first use, so ``orthros eval --help`` / ``orthros demo --help`` start
without torch."""

import importlib

_EXPORTS = {"MQARTask": ("mqar", "MQARTask"), "MQARTrain": ("mqar", "MQARTrain"), "generate_mqar": ("mqar", "generate"),
            "run_mqar": ("mqar", "run_mqar"), "NIAHConfig": ("niah", "NIAHConfig"), "run_niah": ("niah", "run_niah"),
            "score_answer": ("niah", "score_answer"), "prefix_match": ("niah", "prefix_match")}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
