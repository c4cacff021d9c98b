"""The window stream's Triton kernels compiled for sm_90 on any machine (no GPU: ptxas and cuobjdump
ship in the triton wheel), at the benchmark's shape (bf16, Hq 32 / Hkv 8, head dim 128, w 128,
16-divisible pointers and strides): registers, stack (spills) and shared memory a program, and
each loop's SASS instructions a trip by opcode. What kernels change 14 (docs/performance.md) read
before its GPU run: the instruction budget of a trip next to its HGMMAs.

    python benchmarks/kernel_sass.py fwd  [--config 64,32,4,3] [--variant edge|gqa|base|gqa_masked] [--visible]
    python benchmarks/kernel_sass.py dkdv [--config 32,64,4,2] [--visible] [--ds]
    python benchmarks/kernel_sass.py dqds [--config 32,64,8,2]   (DQ_VARIANT "ds": _dq_from_ds)
    python benchmarks/kernel_sass.py dq   [--config 64,64,4,2] [--band]
    ... [--sass OUT.sass] (the whole SASS) [--json OUT.json]

``--config``: BLOCK_M, BLOCK_N, num_warps, num_stages (default: ``attention.CONFIGS`` at head dim
128; for ``--variant gqa*`` BLOCK_M counts packed rows). The masks: the forward's edge blocks and
the dK/dV programs use ``common.band`` (the defaults) unless ``--visible``; the dQ programs use
``visible`` (the default) unless ``--band``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # kernels imported under the interpreter are not compiled
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PTRS = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", LSE="*fp32", POS="*i64", DOC="*i64", DOCSTART="*i64",
            KVSTART="*i64", DO="*bf16", DQ="*bf16", DK="*bf16", DV="*bf16", DELTA="*fp32", QRANGE="*i64", DS="*bf16")


def parse_config(text):
    try:
        cfg = tuple(int(x) for x in text.split(","))
    except ValueError:
        cfg = ()
    if len(cfg) != 4 or any(x < 1 for x in cfg) or any(x < 16 or x & (x - 1) for x in cfg[:2]):
        raise argparse.ArgumentTypeError(f"{text!r}: give BLOCK_M,BLOCK_N,num_warps,num_stages, "
                                         "the blocks powers of two >= 16")
    return cfg


def sm90_compile(fn, const, nospec, num_warps, num_stages):
    """``fn`` compiled for sm_90 as the launcher specialises it at the benchmark's shape: the
    constexprs ``const`` (those left out take their defaults, not runtime i32 arguments), pointers
    typed by ``PTRS``, ``*_scale`` fp32, other integers i32, every argument but ``nospec`` and the
    scales 16-divisible."""
    import inspect

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    const = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.name not in const
                and p.default is not inspect.Parameter.empty}, **const}
    sig = {n: PTRS.get(n, "constexpr" if n in const else "fp32" if n.endswith("_scale") else "i32")
           for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n] != "constexpr" and n not in nospec and not n.endswith("_scale")}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def compile_kernel(kind, cfg, variant="edge", band=True, ds=False):
    """The compiled kernel (``triton.compile``'s result) of one kind of window-stream program
    (``ds``: the dK/dV programs store their dS tiles, DQ_VARIANT "ds")."""
    from orthros.ops.triton import attention as ta

    bm, bn, warps, stages = cfg
    if kind == "fwd":
        fn, nospec = ta._stream_fwd, set(ta._NO_SPEC) | {"slb", "slh", "sls"}
        packed, edge = ta.FWD_VARIANTS[variant]
        gp = 4 if packed else 1
        const = dict(D=128, BLOCK_D=128, BLOCK_M=bm // gp, BLOCK_N=bn, POS_PTR=False, HAS_WINDOW=True, HAS_DOC=False,
                     HAS_KVS=False, NUM_SPLITS=1, PARTIAL=False, REVERSE=False, PREC="tf32", GP=gp, EDGE_MASK=edge,
                     REL=band and edge)
    elif kind == "dqds":  # BLOCK_M, BLOCK_N: the dK/dV programs' (the dS tiles'), G = 4 heads packed
        fn, nospec = ta._dq_from_ds, {"M", "N", "HQ", "nqb", "nslot", "pos_offset", "window", "G"}
        const = dict(D=128, BLOCK_D=128, BLOCK_M=bm, BLOCK_N=bn, GP=4, PREC="tf32")
    else:  # one kind of backward program in its own launch (PROGS 1: dK/dV, 2: dQ)
        fn, nospec = ta._stream_bwd, set(ta._NO_SPEC) | {"HKV", "B", "n_kv_progs", "srb", "nqb", "nslot"}
        blocks = dict(BLOCK_M=bm, BLOCK_N=bn) if kind == "dkdv" else dict(BLOCK_M2=bm, BLOCK_N2=bn)
        const = dict(G=4, D=128, BLOCK_D=128, BLOCK_M=32, BLOCK_N=64, BLOCK_M2=64, BLOCK_N2=64, POS_PTR=False,
                     HAS_WINDOW=True, HAS_DOC=False, HAS_KVS=False, REVERSE=False, PREC="tf32",
                     PROGS=1 if kind == "dkdv" else 2, REL_KV=kind == "dkdv" and band, REL_Q=kind == "dq" and band,
                     DS_OUT=ds)
        const.update(blocks)
    return sm90_compile(fn, const, nospec, warps, stages)


def cuobjdump(args, cubin):
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        raise SystemExit(f"kernel_sass.py: no cuobjdump in this triton wheel ({tool})")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, *args, f.name], capture_output=True, text=True, check=True).stdout


def analyse(cubin):
    """{"registers", "stack_bytes", "loops": [{"start", "end", "instructions", "ops": {opcode: n},
    "inner"}], "sass"} from the cubin: resource usage, and every backward branch's body (a loop)
    counted by opcode; ``inner``: the loop holds no other (its count is one trip's)."""
    usage = cuobjdump(["--dump-resource-usage"], cubin)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    sass = cuobjdump(["-sass"], cubin)
    ins = []
    for line in sass.splitlines():
        mm = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if mm:
            ins.append((int(mm.group(1), 16), mm.group(2).strip()))
    loops = []
    for addr, text in ins:
        target = re.findall(r"0x([0-9a-f]+)", text) if "BRA" in text else []
        if target and int(target[-1], 16) < addr:
            lo = int(target[-1], 16)
            ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                                      for a, t in ins if lo <= a <= addr)
            loops.append({"start": lo, "end": addr, "instructions": sum(ops.values()),
                          "ops": dict(ops.most_common())})
    for lp in loops:  # an outer loop's body holds its inner loops' instructions once, not a trip's
        lp["inner"] = not any(o is not lp and lp["start"] <= o["start"] and o["end"] <= lp["end"] for o in loops)
    for lp in loops:
        lp["start"], lp["end"] = hex(lp["start"]), hex(lp["end"])
    return {"registers": int(m.group(1)) if m else None, "stack_bytes": int(m.group(2)) if m else None,
            "loops": loops, "sass": sass}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("fwd", "dkdv", "dq", "dqds"))
    ap.add_argument("--config", type=parse_config, default=None, help="BLOCK_M,BLOCK_N,num_warps,num_stages")
    ap.add_argument("--variant", default="edge", help="forward variant (fwd only): edge, gqa, base, gqa_masked")
    ap.add_argument("--visible", action="store_true", help="fwd / dkdv: mask with common.visible, not band")
    ap.add_argument("--band", action="store_true", help="dq: mask with common.band, not visible")
    ap.add_argument("--ds", action="store_true", help="dkdv: also store the dS tiles (DQ_VARIANT \"ds\")")
    ap.add_argument("--sass", default=None, help="write the whole SASS here")
    ap.add_argument("--json", default=None, help="write the figures here")
    a = ap.parse_args(argv)
    from orthros.ops.triton import attention as ta

    if a.variant not in ta.FWD_VARIANTS:
        ap.error(f"--variant: {a.variant!r}; allowed: {', '.join(ta.FWD_VARIANTS)}")
    if a.kind != "fwd" and a.variant != "edge":
        ap.error("--variant is for fwd only")
    if (a.kind == "dq" and a.visible) or (a.kind != "dq" and a.band):
        ap.error("--visible is for fwd / dkdv, --band for dq")
    if a.ds and a.kind != "dkdv":
        ap.error("--ds is for dkdv")
    from orthros.utils import check_output_path, commit_id, write_json, write_text

    try:  # was: found by the write, after the compile (a missing folder: a FileNotFoundError traceback)
        for opt, path in (("--sass", a.sass), ("--json", a.json)):
            if path is not None:
                check_output_path(opt, path)
    except ValueError as e:
        ap.error(str(e))
    if a.sass is not None and a.json is not None and os.path.abspath(a.sass) == os.path.abspath(a.json):
        ap.error(f"--sass and --json name one file ({a.json}): give two")
    table = {"fwd": "win_fwd_gqa" if ta.FWD_VARIANTS[a.variant][0] else "win_fwd", "dkdv": "bwd_dkdv",
             "dq": "bwd_dq", "dqds": "bwd_dkdv"}[a.kind]
    cfg = a.config or ta.CONFIGS[table][128]
    if a.kind == "dqds" and not a.config:
        cfg = cfg[:2] + ta.DQ_DS_LAUNCH
    band = a.band if a.kind == "dq" else not a.visible
    k = compile_kernel(a.kind, cfg, a.variant, band, a.ds)
    res = analyse(k.asm["cubin"])
    print(f"{a.kind} {a.variant if a.kind == 'fwd' else ''} config {','.join(map(str, cfg))} "
          f"mask {'band' if band else 'visible'}: {res['registers']} registers, stack {res['stack_bytes']} bytes, "
          f"shared {k.metadata.shared} bytes")
    for lp in res["loops"]:
        top = ", ".join(f"{op} {n}" for op, n in list(lp["ops"].items())[:12])
        what = "instructions a trip" if lp["inner"] else "instructions in its body, inner loops once"
        print(f"  loop {lp['start']}-{lp['end']}: {lp['instructions']} {what} ({top})")
    if a.sass:
        write_text(a.sass, res["sass"])
    if a.json:
        import triton

        out = {"target": "sm_90", "commit": commit_id(), "triton": triton.__version__}  # what compiled it
        out.update({k2: v for k2, v in res.items() if k2 != "sass"})
        out.update(kind=a.kind, variant=a.variant if a.kind == "fwd" else None, config=list(cfg),
                   mask="band" if band else "visible", ds=a.ds, shared=k.metadata.shared)
        write_json(a.json, out, indent=1)


if __name__ == "__main__":
    main()
