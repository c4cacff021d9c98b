"""``benchmarks/train_throughput.py``: bad values refused (exit 2, naming the option) before any
model is built or any line written. (Its CPU run: tests/training/test_trainer.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_script import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "train_throughput.py"


@pytest.fixture(scope="module")
def tt():
    return load_script(SCRIPT, "train_throughput_script")


# were: a traceback after the model was built and its steps ran (IndexError of an empty median at --steps 0,
# UnboundLocalError at --grad-accum 0, the model's own errors), a line written with micro_batch 0 and
# tokens_per_s 0.0, "mfu": NaN (not JSON) at --peak-tflops nan, FileNotFoundError of --out after the first arch
@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["--grad-accum", "0"], "--grad-accum must be an integer >= 1, got 0"),
    (["--micro-batch", "0"], "--micro-batch must be an integer >= 1, got 0"),
    (["--window", "0"], "--window must be an integer >= 1, got 0"),
    (["--swa-window", "-4"], "--swa-window must be an integer >= 1, got -4"),
    (["--seq-len", "1"], "--seq-len must be >= 2"),
    (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["--peak-tflops", "nan"], "--peak-tflops must be a positive number of TFLOP/s, got nan"),
    (["--peak-tflops", "0"], "--peak-tflops must be a positive number of TFLOP/s, got 0.0"),
    (["--out", "{tmp}/file/b.jsonl"], "file is a file, not a directory"),
])
def test_bad_values_exit_2_before_work(tt, tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.setattr(tt, "bench_one", lambda *a, **k: pytest.fail("a benchmark ran"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as e:
        tt.main(["--shape", "tiny", "--device", "cpu", *(x.format(tmp=tmp_path) for x in args)])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_out_in_a_new_folder_is_made(tt, tmp_path, monkeypatch):
    """Was: FileNotFoundError when the first line was appended, after the first architecture ran."""
    monkeypatch.setattr(tt, "bench_one", lambda arch, a, device: {"arch": arch})
    out = tmp_path / "new" / "dir" / "t.jsonl"
    assert tt.main(["--shape", "tiny", "--device", "cpu", "--arch", "orthros", "--out", str(out)]) == 0
    assert out.read_text() == '{"arch": "orthros"}\n'


def test_cuda_without_a_gpu_is_refused_by_name(tt, capsys, monkeypatch):
    monkeypatch.setattr(tt.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(tt, "bench_one", lambda *a, **k: pytest.fail("a benchmark ran"))
    with pytest.raises(SystemExit) as e:  # was: AssertionError "Torch not compiled with CUDA enabled" mid-build
        tt.main(["--shape", "tiny", "--device", "cuda"])
    assert e.value.code == 2 and "--device cuda: no CUDA device here" in capsys.readouterr().err


def test_auto_device_without_a_gpu_needs_the_tiny_shape(tt, capsys, monkeypatch):
    """Was: --device auto fell back to the CPU and trained the default 1.3B shape there."""
    monkeypatch.setattr(tt.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(tt, "bench_one", lambda arch, a, device: {"arch": arch, "device": str(device)})
    with pytest.raises(SystemExit) as e:
        tt.main([])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--device auto: no CUDA device here, and --shape 1.3b" in err and "--shape tiny" in err
    assert tt.main(["--shape", "tiny", "--arch", "orthros"]) == 0  # a tiny shape still falls back
    assert '"device": "cpu"' in capsys.readouterr().out
