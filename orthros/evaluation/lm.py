"""``orthros eval lm``: lm-evaluation-harness on an Orthros (or convertible) checkpoint.

The shipped offline task folder (``data/lm_tasks``) is always on the include path, so
``--tasks orthros_tiny_cloze`` works with no download.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import subprocess
from pathlib import Path
from typing import Optional, Sequence

from ..utils import hf_progress_bars, install_hint, parse_dtype
from .common import (LM_TASKS_DIR, check_token_range, load_model, load_tokenizer, read_config, read_model_type,
                     tokenizer_name)


def _require_lm_eval():
    """lm-evaluation-harness and the accelerate its HF model needs, before any work."""
    for module, what in (("lm_eval", "lm-evaluation-harness"), ("accelerate", "accelerate (lm_eval's HF model)")):
        try:
            __import__(module)
        except ImportError:
            raise ValueError(f"`orthros eval lm` needs {what}: {install_hint('eval')}") from None


def check_include_paths(paths: Sequence, arg: str = "include_path") -> None:
    """Each of ``paths`` a folder (of task YAMLs), else a ``ValueError`` naming ``arg`` (the caller's
    name for them: ``--include-path`` as typed on the command line)."""
    for p in paths:
        if not Path(p).exists():
            raise ValueError(f"{arg} {p}: no such directory")
        if not Path(p).is_dir():  # lm-eval scans it for YAMLs: a file would hold none
            raise ValueError(f"{arg} {p}: not a directory (give the folder that holds the task YAMLs)")


def task_manager(include_path: Optional[Sequence[str]] = None, tasks: Sequence[str] = ()):
    """lm-eval's index of the shipped task folder, the ``include_path`` folders and lm-eval's own registry;
    of the folders alone where they hold every one of ``tasks`` (each a task, no group or tag, which may
    name tasks of the registry): the registry is ~14,000 YAMLs, 5-10 s to read on 2 CPU cores."""
    from lm_eval.tasks import TaskManager

    paths = [str(LM_TASKS_DIR)] + [str(p) for p in (include_path or [])]
    check_include_paths(paths)
    wanted = {t.strip() for t in tasks if t and t.strip()}
    if wanted:
        local = TaskManager(include_path=paths, include_defaults=False)
        if wanted <= set(local.all_subtasks):
            return local
    return TaskManager(include_path=paths)


def check_tasks(tasks: Sequence[str], tm) -> list[str]:
    tasks = [t.strip() for t in tasks if t and t.strip()]
    if not tasks:
        raise ValueError("--tasks must name at least one lm-eval task (e.g. orthros_tiny_cloze)")
    known = set(tm.all_tasks)
    for t in tasks:
        if t not in known:
            close = difflib.get_close_matches(t, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ValueError(f"unknown lm-eval task {t!r}{hint} (see `lm_eval ls tasks`; a folder of "
                             f"local task YAMLs is added with --include-path DIR, include_path=[DIR] in Python)")
    return tasks


class _ProgressBar:
    """What lm-eval's ``tqdm(...)`` calls get inside :func:`_lm_eval_quietly`: an
    :class:`orthros.utils.Progress`, so that lm-eval's progress follows the rule of the other
    commands (a bar at a terminal, plain ``[desc] it n/total`` lines in a log or a pipe, nothing
    with ``enabled=False``)."""

    def __init__(self, iterable=None, desc=None, total=None, disable=False, *, enabled=True, **_):
        from ..utils import Progress

        if total is None and iterable is not None:
            try:
                total = len(iterable)
            except TypeError:
                total = None
        self.iterable = iterable
        self._p = Progress(total, desc or "lm-eval", enabled=enabled and not disable)

    def __iter__(self):
        try:
            for x in self.iterable:
                yield x
                self._p.update(1)
        finally:
            self._p.close()

    def update(self, n=1):
        self._p.update(n)

    def close(self):
        self._p.close()

    def set_description(self, *_, **__):
        pass

    def set_postfix(self, *_, **__):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _git_commit_hash():
    """lm-eval's ``get_git_commit_hash`` (the commit of the folder it runs in, recorded in its results)
    without git's ``fatal: not a git repository`` on stderr when that folder is no checkout."""
    from lm_eval.loggers.utils import get_commit_from_path

    try:
        r = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git
        r = None
    if r is not None and r.returncode == 0 and r.stdout.strip():
        return r.stdout.strip()
    return get_commit_from_path(os.getcwd())


def _no_metadata_hint(record) -> bool:
    """Drops lm-eval's warning for every task with a dataset function (as the shipped task has), which
    points at lm-eval's own ``--metadata`` option: ``orthros eval lm`` has none."""
    return "Custom kwargs can be passed to `--metadata`" not in str(record.msg)


@contextlib.contextmanager
def _lm_eval_quietly(progress: bool, metadata_hint: bool = False):
    """Inside the block, lm-eval's progress bars are :class:`_ProgressBar` (``progress``: shown),
    transformers' own bars (loading weights) show only with ``progress`` at a terminal, and lm-eval's
    git look-up keeps git's complaint off stderr (and its ``--metadata`` hint, unless ``metadata_hint``:
    lm-eval's own command line has that option; :func:`_no_metadata_hint`); as they were after it."""
    import functools
    import importlib
    import logging

    patches = [("lm_eval.evaluator", "get_git_commit_hash", _git_commit_hash)]
    bar = functools.partial(_ProgressBar, enabled=progress)
    patches += [(m, "tqdm", bar) for m in ("lm_eval.api.task", "lm_eval.api.model", "lm_eval.models.huggingface")]
    saved, task_log = [], logging.getLogger("lm_eval.api.task")
    if not metadata_hint:
        task_log.addFilter(_no_metadata_hint)
    try:
        for module, name, new in patches:
            mod = importlib.import_module(module)
            if hasattr(mod, name):  # (another lm-eval version may not have it: then its own stays)
                saved.append((mod, name, getattr(mod, name)))
                setattr(mod, name, new)
        with hf_progress_bars(progress):
            yield
    finally:
        for mod, name, old in reversed(saved):
            setattr(mod, name, old)
        task_log.removeFilter(_no_metadata_hint)


def run_lm_eval(model_path, tasks, *, include_path=None, limit=None, batch_size=1, device="cpu", dtype=None,
                num_fewshot=None, window_size=128, tokenizer=None, seed=0, progress: bool = True) -> dict:
    """Validate everything, then run ``lm_eval.simple_evaluate``. Returns lm-eval's results dict.
    ``progress``: lm-eval's progress on stderr (a bar at a terminal, plain lines elsewhere)."""
    _require_lm_eval()
    cfg = read_config(model_path)
    mt = read_model_type(model_path, cfg)
    if limit is not None and (isinstance(limit, bool) or limit <= 0):
        raise ValueError(f"--limit must be > 0, got {limit!r}")
    tm = task_manager(include_path, tasks)
    tasks = check_tasks(list(tasks), tm)

    import orthros  # noqa: F401  (registers the Auto classes for lm-eval's HF loader)
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    tok = load_tokenizer(model_path, tokenizer)  # before the model: a missing or bad tokenizer costs no load
    # ids beyond the embedding would be its IndexError, deep in lm-eval's run
    check_token_range(len(tok) - 1, cfg.get("vocab_size"), tokenizer_name(model_path, tokenizer))
    with _lm_eval_quietly(progress):  # (from here: the model loads with the progress bars it shows)
        if mt == "orthros" and tokenizer is None:
            from transformers import AutoConfig

            from ..models.loading import check_weights_fit

            # lm-eval's loader would leave a tensor the weights lack at random (transformers only logs it)
            check_weights_fit(model_path, AutoConfig.from_pretrained(str(model_path)))
            # exactly what `lm_eval --model hf --model_args pretrained=PATH` does
            # (the tokenizer is the one it would load: AutoTokenizer of PATH)
            args = {"pretrained": str(model_path), "tokenizer": tok, "device": device, "batch_size": batch_size,
                    "backend": "causal"}  # (lm-eval warns that it cannot tell for a model type it does not know)
            if dtype:  # lm-eval reads torch's own names (bfloat16), not our short ones (bf16)
                args["dtype"] = str(parse_dtype(dtype, "dtype")).replace("torch.", "")
            lm = HFLM(**args)
        else:  # converted on the fly (or a separate tokenizer): hand lm-eval the model object
            model = load_model(model_path, device=device, dtype=dtype, window_size=window_size)
            model.config.name_or_path = str(model_path)  # what lm-eval's results name the model by (converted: none)
            lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, backend="causal")
        # batch_size and device only go into the results' config here (lm-eval records its own arguments)
        res = simple_evaluate(model=lm, tasks=tasks, task_manager=tm, limit=limit, num_fewshot=num_fewshot,
                              batch_size=batch_size, device=device, random_seed=seed, numpy_random_seed=seed,
                              torch_random_seed=seed, fewshot_random_seed=seed, log_samples=False)
    if isinstance(res, dict):  # (None on the ranks but the first of a distributed run)
        res["orthros"] = model_record(lm.model, mt, tokenizer or model_path)
    return res


def model_record(model, model_type: str, tokenizer) -> dict:
    """What the scores depend on besides the weights, for the results: the attention and window the model
    ran with (a converted model's window is ``--window``, lm-eval's config names none), the checkpoint's own
    ``model_type`` (converted on the fly unless ``orthros``), the dtype and the tokenizer."""
    from ..utils import dtype_name

    c = model.config
    return {"model_type": model_type, "converted": model_type != "orthros",
            "attention_mode": getattr(c, "attention_mode", None), "window_size": getattr(c, "window_size", None),
            "dtype": dtype_name(next(model.parameters()).dtype), "tokenizer": str(tokenizer)}


def summary(results: dict) -> dict:
    """The JSON-able part of lm-eval's results (metrics per task, config)."""
    keep = {k: results[k] for k in ("results", "versions", "n-shot", "higher_is_better", "orthros") if k in results}
    cfg = results.get("config", {})
    keep["config"] = {k: v for k, v in cfg.items() if isinstance(v, (str, int, float, bool, type(None), list))}
    return keep
