"""The training runtime as a user meets it: a full disk mid-save, metrics files a crash or an
editor left damaged, runs of few logged rows."""

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("datasets", reason="training needs the `datasets` package")

from forked_cli import run_module  # noqa: E402
from test_trainer import corpus, tiny  # noqa: E402,F401  (the module's fixture and arguments)

REPO = Path(__file__).resolve().parents[2]


def run_cli(args, max_file_bytes=None):
    """``python -m orthros.train ARGS`` in a process of its own (``forked_cli``), its file size limited."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("ORTHROS_TRACEBACK", None)
    return run_module("orthros.train", args, env=env, cwd=REPO, max_file_bytes=max_file_bytes)


# the tiny model's model.safetensors is ~0.6 MB, its trainer_state.pt ~1.25 MB
@pytest.mark.parametrize("limit, file", [(300_000, "model.safetensors"), (900_000, "trainer_state.pt")])
def test_a_full_disk_mid_save_is_one_line_naming_the_checkpoint(tmp_path, corpus, limit, file):
    """A write refused mid-save (a full disk; here a file-size limit) was safetensors' traceback, or
    torch's `[enforce fail at inline_container.cc] unexpected pos`, naming no checkpoint. It is one line,
    exit 1, naming the file and the step, and the cut-short save leaves nothing behind."""
    r = run_cli(tiny(tmp_path, corpus, "--max_steps", "2", "--checkpoint.every", "2"), max_file_bytes=limit)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("orthros train: error: ") and "checkpoint of step 2" in last and file in last, last
    assert list((tmp_path / "checkpoints").iterdir()) == []


ROW = '{{"kind": "train", "step": {0}, "loss": 1.5, "tokens": {0}}}'


@pytest.mark.parametrize("tail", [b"\n", b"\n5\n", b'\n{"kind": "tr\xff", "step": 9}\n', b'\n{"kind": "train", "st'])
def test_a_resumed_run_logs_past_a_damaged_metrics_file(tmp_path, tail):
    """A resume rewrites metrics.jsonl without the rows after its checkpoint. A line of JSON that is no
    row (`5`) was an AttributeError, a damaged byte a UnicodeDecodeError (both ended the run; `orthros
    plot` reads such a file); a last row without its newline (an editor's save) was kept as it was, and
    the next row appended to its line, so both were lost."""
    from orthros.training.metrics import MetricsLogger, read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(("\n".join(ROW.format(s) for s in (1, 2, 3))).encode() + tail)
    logger = MetricsLogger(str(tmp_path), tensorboard=False, resume_step=2)
    logger.log(json.loads(ROW.format(3)))
    logger.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]


def test_a_last_row_without_its_newline_keeps_its_row_on_resume(tmp_path):
    from orthros.training.metrics import MetricsLogger, read_metrics

    (tmp_path / "metrics.jsonl").write_text("\n".join(ROW.format(s) for s in (1, 2)))  # no newline at the end
    logger = MetricsLogger(str(tmp_path), tensorboard=False, resume_step=2)
    logger.log(json.loads(ROW.format(3)))
    logger.close()
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a disk that is always full)")
def test_a_full_disk_under_metrics_jsonl_names_the_file(tmp_path):
    """A row that cannot be logged was `OSError: [Errno 28] No space left on device`, naming no file;
    the close that follows (the trainer's `finally`) raised it again."""
    from orthros.training.metrics import MetricsLogger

    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    logger = MetricsLogger(str(tmp_path), tensorboard=False, resume_step=0)
    with pytest.raises(OSError, match=r"metrics\.jsonl: cannot log a row \(No space left on device\)") as e:
        logger.log(json.loads(ROW.format(1)))
    assert e.value.errno == 28
    logger.close()  # said once


@pytest.mark.parametrize("clip", ["1.0", "0"])
def test_gradients_that_overflow_stop_the_run_before_a_checkpoint_saves_them(tmp_path, corpus, monkeypatch, clip):
    """A step whose loss is finite but whose gradients are not (an overflow) was clipped by its nan
    norm, which made every weight nan; that step's checkpoint saved them, and the run stopped only at
    the next step ('loss is nan at step 4'), its latest checkpoint unusable. It stops at that step, also
    without clipping (optim.grad_clip 0 computed no norm: AdamW's update made the weights nan the same way)."""
    import torch

    from orthros.training import trainer as T
    from orthros.training.checkpoint import list_checkpoints
    from orthros.training.config import load_config
    from orthros.training.metrics import read_metrics

    forward_sum = T.Trainer._forward_sum

    def overflowing(self, batch):
        ce, n = forward_sum(self, batch)
        if self.step == 2:  # step 3: d sqrt(x)/dx at 0 is inf, x 0 (w * 0): a nan gradient, the loss unchanged
            ce = ce + torch.sqrt((next(self.model.parameters()) * 0).sum())
        return ce, n

    monkeypatch.setattr(T.Trainer, "_forward_sum", overflowing)
    with pytest.raises(FloatingPointError, match=r"^the gradient norm is nan at step 3 \(loss \d+\.\d{4}\); lower optim.lr"):
        T.train(load_config(None, tiny(tmp_path, corpus, "--max_steps", "6", "--checkpoint.every", "3",
                                       "--optim.grad_clip", clip)))
    assert list_checkpoints(str(tmp_path)) == []
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]


def test_a_resume_stopped_while_rewriting_metrics_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) while a resume rewrote metrics.jsonl left its metrics.jsonl.tmp-PID
    beside it for good; the file itself is the old one, whole."""
    from orthros.training import metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(ROW.format(s) + "\n" for s in (1, 2, 3)))

    def interrupted(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(metrics.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        metrics.drop_rows_after(str(path), 2)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]
    assert len(metrics.read_metrics(str(tmp_path))) == 3
