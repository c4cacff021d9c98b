"""Issue 17 item 6: a conversion killed with SIGTERM, SIGINT or kill -9 leaves nothing behind.

SIGTERM / SIGINT: the CLI removes its temporary directory, prints one line (no traceback) and
exits 143 / 130. kill -9 cannot be handled: the hidden ``.<DST>.orthros-tmp-<pid>-*``
directory stays, and the next run into the same DST removes it (a live process's is kept).
The source is a sharded synthetic checkpoint; the test hook ORTHROS_CONVERT_TEST_PAUSE
holds the conversion after its second shard so the signal lands mid-way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from orthros.conversion.cli import main as convert_main
from orthros.conversion.convert import clean_stale

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sharded_source(tmp_path_factory):
    path = tmp_path_factory.mktemp("sharded_src")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
    model.save_pretrained(path, max_shard_size="40KB")
    shards = sorted(path.glob("*.safetensors"))
    assert len(shards) >= 4, shards
    return path


def _leftovers(parent: Path):
    return sorted(p for p in parent.iterdir() if ".orthros-tmp-" in p.name or ".orthros-old-" in p.name)


def _start(src: Path, dst: Path) -> subprocess.Popen:
    env = dict(os.environ, ORTHROS_CONVERT_TEST_PAUSE="1:120", PYTHONPATH=str(ROOT))
    # SIGINT back to its default in the child: a test run started as a background job of a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no Ctrl-C handler
    return subprocess.Popen([sys.executable, "-m", "orthros", "convert", str(src), str(dst), "-q"], cwd=str(ROOT),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_mid_way(proc: subprocess.Popen, parent: Path) -> Path:
    """Block until the conversion has written two shards into its temporary directory."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        tmps = _leftovers(parent)
        if tmps and len(list(tmps[0].glob("*.safetensors"))) >= 2:
            return tmps[0]
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the conversion never reached its second shard")


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated"), (signal.SIGINT, 130, "interrupted")])
def test_signal_mid_conversion_cleans_up(sharded_source, tmp_path, sig, code, word):
    dst = tmp_path / "out"
    proc = _start(sharded_source, dst)
    tmp = _wait_mid_way(proc, tmp_path)
    assert str(proc.pid) in tmp.name  # the temporary directory names its process
    time.sleep(0.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (proc.returncode, err)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and word in lines[0] and "Traceback" not in err, err
    assert not dst.exists()
    assert _leftovers(tmp_path) == []


def test_kill9_leftovers_removed_by_next_run(sharded_source, tmp_path):
    dst = tmp_path / "out"
    proc = _start(sharded_source, dst)
    tmp = _wait_mid_way(proc, tmp_path)
    proc.kill()  # SIGKILL: nothing can clean up
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert _leftovers(tmp_path) == [tmp] and tmp.is_dir() and not dst.exists()
    assert convert_main([str(sharded_source), str(dst), "--window-size", "8", "-q"]) == 0
    assert _leftovers(tmp_path) == []
    assert (dst / "config.json").is_file() and (dst / "conversion_report.json").is_file()


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_clean_stale_keeps_live_and_restores_replaced(tmp_path):
    dst = tmp_path / "model"
    live = tmp_path / f".model.orthros-tmp-{os.getpid()}-abc"
    dead = tmp_path / f".model.orthros-tmp-{_dead_pid()}-def"
    legacy = tmp_path / ".model.orthros-tmp-x1y2z3"  # name without a pid (older versions): stale
    other = tmp_path / f".other.orthros-tmp-{_dead_pid()}-ghi"  # another destination's: not ours to touch
    for d in (live, dead, legacy, other):
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"x" * 10)
    removed = clean_stale(dst)
    assert sorted(removed) == sorted([dead, legacy])
    assert live.is_dir() and other.is_dir() and not dead.exists() and not legacy.exists()
    # killed between moving the previous DST aside and renaming the new one in: the old one comes back
    old = tmp_path / f".model.orthros-old-{_dead_pid()}-0a1b2c3d"
    old.mkdir()
    (old / "config.json").write_text("{}")
    clean_stale(dst)
    assert (dst / "config.json").read_text() == "{}" and not old.exists()
    # ... and is simply removed when DST is there
    old.mkdir()
    clean_stale(dst)
    assert not old.exists() and dst.is_dir()


def test_previous_result_put_back_is_not_replaced_without_overwrite(sharded_source, tmp_path, capsys):
    """A kill -9 between moving the old DST aside and renaming the new one in leaves the old one as
    .out.orthros-old-<pid>-*: the next run puts it back before checking DST, so without --overwrite
    it is refused (it was put back after the check, then replaced by the new conversion)."""
    dst = tmp_path / "out"
    old = tmp_path / f".out.orthros-old-{_dead_pid()}-0a1b2c3d"
    old.mkdir()
    (old / "config.json").write_text("{}")
    assert convert_main([str(sharded_source), str(dst), "--window-size", "8", "-q"]) == 2
    assert "pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (dst / "config.json").read_text() == "{}"
