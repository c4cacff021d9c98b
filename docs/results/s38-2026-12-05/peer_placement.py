"""s38 call 2: does gpt-fast's step change with where its buffers land, inside one process?

Call 1 found the peer's spread between processes in one kernel, its down projection
(``..._mm_mul_silu_...``: 39-49 us a call against 64-65 for gate/up, with the same kernels and
tuned configs), and none inside a process. Here, in one process (run from the repository root,
``.gpu/gpt-fast`` holding gpt-fast's model.py):

* two instances of the peer's model (weights allocated anew, after a spacer allocation);
* for each, three compiles of its step (``torch._dynamo.reset()`` between them: the same kernels
  from Inductor's cache, a new CUDA graph and memory pool for the activations, each recorded
  after a new spacer).

Each graph's step is timed as ``roofline.py`` times it and traced kernel by kernel. The output has
one line a graph: the step, the down kernel's time a call, and the two gate/up kernels'.
``--out FILE`` writes the rows as JSON. ``--pair`` (call 3) also times the engine's Orthros pair
of the same shape (compiled, fused GEMVs, as ``roofline.py --gemv`` does) before the first graph
and after the last, and prints each graph's ratio to it: the #18 target's ratio, one setup of
the peer at a time, in one process.
"""

import argparse
import json
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.getcwd())
from orthros.benchmarks.models import PRESETS, ROPE_THETA  # noqa: E402
from orthros.benchmarks.roofline import GptFastPeer, load_gpt_fast  # noqa: E402
from orthros.models import OrthrosConfig  # noqa: E402

REPS = 3


def decode_one_token(model, x, input_pos):  # GptFastPeer's, which is generate.py's minus sampling
    return model(x, input_pos)


def by_name(kernels):
    acc = defaultdict(lambda: [0, 0.0])
    for name, _, us in kernels:
        acc[name][0] += 1
        acc[name][1] += us
    return {n: {"calls": c / REPS, "mean_us": t / c} for n, (c, t) in acc.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", default=".gpu/gpt-fast")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--out", default=None)
    ap.add_argument("--preset", default="qwen3-8b", choices=("qwen3-8b", "tiny"))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (eager, no trace)")
    ap.add_argument("--pair", action="store_true", help="also time the engine's Orthros pair, before and after")
    a = ap.parse_args()
    cfg = OrthrosConfig(**PRESETS[a.preset], qk_norm=True, window_size=128,
                        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA})
    mod = load_gpt_fast(a.peer)
    spacers, rows, pair = [], [], []

    def time_pair():
        from orthros.benchmarks.inference import bench_decode
        from orthros.benchmarks.models import orthros_model

        model = orthros_model(a.preset, device=a.device, dtype=torch.bfloat16 if cuda else torch.float32)
        r = bench_decode(model, [a.context], batch_sizes=(1,), modes=("orthros",), compile=cuda, gemv=True)[0]
        pair.append(r["ms_per_step"])
        print(f"the Orthros pair: {r['ms_per_step']:.3f} ms", flush=True)
        del model
        if cuda:
            torch.cuda.empty_cache()
    cuda = a.device == "cuda"
    print(torch.cuda.get_device_name() if cuda else a.device, flush=True)
    if a.pair:
        time_pair()
    for m in range(2):
        spacers.append(torch.empty((37 + 293 * m) << 20, dtype=torch.uint8, device=a.device))
        peer = GptFastPeer(mod, cfg, device=a.device, dtype=torch.bfloat16 if cuda else torch.float32,
                           block_size=a.context + 100, compile=cuda)
        for g in range(3):
            if g:
                spacers.append(torch.empty((11 + 97 * g) << 20, dtype=torch.uint8, device=a.device))
                torch._dynamo.reset()
                if cuda:
                    peer.step = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True)
            r = peer.time_decode(1, a.context, steps=50, warmup=5, trace=REPS if cuda else 0)
            k = by_name(r.get("kernels", []))
            down = {n: v for n, v in k.items() if "mm_mul_silu" in n}
            heavy = sorted(k, key=lambda n: -k[n]["calls"] * k[n]["mean_us"])[:4]
            row = {"model": m, "graph": g, "step_ms": r["ms_per_step"], "down": down,
                   "heavy": {n: k[n] for n in heavy},
                   "w2_ptr_mod_2MB": peer.model.layers[0].feed_forward.w2.weight.data_ptr() % (2 << 20)}
            rows.append(row)
            print(f"model {m} graph {g}: step {r['ms_per_step']:.3f} ms; down "
                  + ", ".join(f"{v['mean_us']:.2f} us x{v['calls']:.0f}" for v in down.values())
                  + "; heavy " + ", ".join(f"{n[-28:]} {k[n]['mean_us']:.2f}" for n in heavy), flush=True)
        del peer
        if cuda:
            torch.cuda.empty_cache()
    steps = [r["step_ms"] for r in rows]
    print(f"steps {min(steps):.3f}-{max(steps):.3f} ms, max / min {max(steps) / min(steps):.4f}")
    if a.pair:
        time_pair()
        ratios = [s / max(pair) for s in steps]
        print(f"gpt-fast / the pair ({max(pair):.3f} ms, the slower of its two timings): "
              + " ".join(f"{x:.3f}" for x in ratios) + f"; 1.2x in {sum(x >= 1.2 for x in ratios)} of {len(ratios)}")
        rows.append({"pair_ms": pair, "ratios": ratios})
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
