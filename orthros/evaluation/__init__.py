"""Evaluations of Orthros models (paper Section 4.4): multi-query associative recall (MQAR),
needle-in-a-haystack, lm-evaluation-harness, and the ``orthros demo``. See docs/evaluation.md."""

from .mqar import MQARTask, MQARTrain, generate as generate_mqar, run_mqar
from .niah import NIAHConfig, run_niah, score_answer

__all__ = ["MQARTask", "MQARTrain", "generate_mqar", "run_mqar", "NIAHConfig", "run_niah", "score_answer"]
