"""``orthros convert`` streams: peak memory near one tensor / shard, not the whole model.

Also checks the small safetensors writer it streams with against the real safetensors reader.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from orthros.conversion.safetensors_io import StreamingWriter, TensorReader, read_header

_MEASURE = textwrap.dedent("""
    import json, sys
    import orthros
    from orthros.conversion.cli import main
    # everything the conversion imports, loaded before the baseline: `import orthros` is lazy, and
    # module imports are not the conversion's memory
    import orthros.conversion.convert, orthros.models, orthros.models.remote_code  # noqa: E401,F401

    def status_kb(key):  # this process's own memory (ru_maxrss would include the parent's at fork)
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))

    mode, src, dst = sys.argv[1:4]
    try:  # reset the high-water mark to the current RSS, so the peak is the conversion's own
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    before = status_kb("VmRSS")
    if mode == "cli":
        rc = main([src, dst, "-q"] + sys.argv[4:])
    else:  # control: the in-memory conversion holds the whole model
        model = orthros.convert_from_hf(src, window_size=8)
        rc = 0
    print(json.dumps({"rc": rc, "growth_kb": status_kb("VmHWM") - before}))
""")


def _synthetic_llama(path, layers=12, hidden=384, inter=1536, vocab=8192):
    """A ~140 MB fp32 Llama checkpoint, one shard per layer (+ embeddings, + head)."""
    path.mkdir()
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=256)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(path)
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    shards = [{"model.embed_tokens.weight": rnd(vocab, hidden)}]
    for i in range(layers):
        p = f"model.layers.{i}."
        shards.append({
            **{p + f"self_attn.{n}_proj.weight": rnd(hidden, hidden) for n in "qkvo"},
            p + "mlp.gate_proj.weight": rnd(inter, hidden), p + "mlp.up_proj.weight": rnd(inter, hidden),
            p + "mlp.down_proj.weight": rnd(hidden, inter),
            p + "input_layernorm.weight": rnd(hidden), p + "post_attention_layernorm.weight": rnd(hidden),
        })
    shards.append({"model.norm.weight": rnd(hidden), "lm_head.weight": rnd(vocab, hidden)})
    weight_map, sizes = {}, []
    for k, sd in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sd, path / name, metadata={"format": "pt"})
        weight_map.update({n: name for n in sd})
        sizes.append(sum(t.numel() * 4 for t in sd.values()))
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return sum(sizes), max(sizes)


def _growth_mb(mode, src, dst, *extra) -> float:
    out = subprocess.run([sys.executable, "-c", _MEASURE, mode, str(src), str(dst), *extra],
                         capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0, out.stderr
    return res["growth_kb"] / 1024


def test_peak_memory_streams_shard_by_shard(tmp_path):
    total, largest = _synthetic_llama(tmp_path / "src")
    total_mb, largest_mb = total / 2**20, largest / 2**20
    assert total_mb > 8 * largest_mb  # big enough that "whole model" and "one shard" are far apart

    growth = _growth_mb("cli", tmp_path / "src", tmp_path / "dst")
    control = _growth_mb("python", tmp_path / "src", tmp_path / "unused")
    print(f"\nsynthetic checkpoint {total_mb:.0f} MB, largest shard {largest_mb:.1f} MB: peak memory growth "
          f"streaming {growth:.1f} MB; in-memory control {control:.0f} MB")
    # the measurement can see a whole model being held ...
    assert control > 0.9 * total_mb
    # ... and the streaming converter stays near one shard: the shard's mmapped pages (they count in
    # RSS once read), the copy being written, and allocator slack -- 20-25 MB measured for a 12 MB
    # shard, against the 130+ MB a converter holding the model would add
    assert growth < 3 * largest_mb, growth
    assert growth < 0.3 * total_mb, growth
    index = json.loads((tmp_path / "dst" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 14


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool, torch.uint8]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 5), max_size=3)), min_size=1,
                max_size=6))
def test_streaming_writer_matches_safetensors(tmp_path_factory, specs):
    path = tmp_path_factory.mktemp("st") / "x.safetensors"
    tensors = {}
    for i, (dtype, shape) in enumerate(specs):
        t = torch.randn(shape) * 10
        tensors[f"t{i}"] = t > 0 if dtype == torch.bool else t.to(dtype)
    w = StreamingWriter(path, [(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()])
    for n, t in tensors.items():
        w.write(n, t)
    w.close()
    back = load_file(path)  # the reference reader accepts the file ...
    assert back.keys() == tensors.keys()
    for n, t in tensors.items():
        assert back[n].dtype == t.dtype and torch.equal(back[n], t)
    hdr = read_header(path)  # ... and so does our validator, on our files and on theirs
    assert list(hdr.tensors) == list(tensors)
    with TensorReader(hdr) as reader:  # whole tensors, and slices of rows (the tied-head check reads those)
        for n, t in tensors.items():
            assert torch.equal(reader.get(n), t)
            for a, b in ((0, 1), (1, 3), (2, 99)) if t.dim() else ():
                assert torch.equal(reader.get_rows(n, a, b), t[a:b])
    save_file(tensors, path)
    assert set(read_header(path).tensors) == set(tensors)


def test_malformed_header_values_are_a_safetensors_error(tmp_path):
    """A header whose ``__metadata__`` is no object, or whose dtype is no string, was a
    TypeError traceback (``orthros convert`` printed it whole) instead of the error naming the file."""
    import pytest

    from orthros.conversion.safetensors_io import SafetensorsError

    path = tmp_path / "x.safetensors"
    save_file({"a": torch.ones(2)}, path)
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    for key, value in (("__metadata__", 5), ("__metadata__", ["x"]), ("a", {**header["a"], "dtype": ["F32"]})):
        raw = json.dumps({**header, key: value}).encode()
        path.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
        with pytest.raises(SafetensorsError, match="x.safetensors: (corrupt|tensor .a. has unsupported dtype)"):
            read_header(path)
