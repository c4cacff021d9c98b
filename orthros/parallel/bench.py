"""Sequence-parallel prefill benchmark: Orthros on N GPUs vs 1 GPU vs the Transformer.

    torchrun --nproc-per-node N -m orthros.parallel.bench --lengths 64K,128K,256K,512K

Random weights of a Qwen3-8B-shaped model (bf16). In one launch it measures, for each length:

* Orthros sharded over all N ranks (latency = slowest rank; peak memory and KV-cache bytes per rank);
* Orthros on 1 GPU (rank 0 alone, same code with a world of one; the others wait);
* the Transformer (same weights, causal SDPA) on 1 GPU, and over N GPUs through PyTorch's
  context parallelism (ring attention) where it runs.

Where a Transformer figure was not measured it is ESTIMATED from the measured 1-GPU figures (a
least-squares fit ``t = a T + b T^2``; N GPUs: that / N, ideal scaling with no communication, a
lower bound on ring attention) and labelled ``estimate``. A time budget skips measurements
predicted to overrun it (a ``skipped`` record says so). Results go to ``--out`` (JSON) as they are
measured; rank 0 prints a markdown table at the end.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import sys
import time

import torch
import torch.distributed as dist

from ..utils import DTYPE_CHOICES, check_device, check_output_path, commit_id, parse_dtype, to_json, write_json
from .comm import (MAX_TIMEOUT_S, ParallelContext, ParallelError, check_timeout, env_local_world_size, env_world_size,
                   init_from_env)
from .sharded import ShardedOrthros



def parse_lengths(s: str):
    out = []
    for part in str(s).split(","):
        part = part.strip()
        if not part:
            continue
        mult, digits = 1, part
        if part[-1] in "kK":
            mult, digits = 1024, part[:-1]
        elif part[-1] in "mM":
            mult, digits = 1024 * 1024, part[:-1]
        try:
            val = int(digits) * mult
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad length {part!r}: use integers like 65536 or 64K") from None
        if val < 1:
            raise argparse.ArgumentTypeError(f"lengths must be >= 1, got {val}")
        out.append(val)
    return list(dict.fromkeys(out))  # a length given twice is one point (it was measured twice)


def positive_int(s: str) -> int:
    try:
        val = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}") from None
    if val < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {s!r}")
    return val


def model_config(name: str, layers=None, window: int = 128):
    from ..models import OrthrosConfig

    if name == "qwen3-8b":
        kw = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, qk_norm=True,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6)
    elif name == "tiny":
        kw = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, qk_norm=True)
    else:
        raise ValueError(f"--model must be qwen3-8b or tiny, got {name!r}")
    if layers:
        kw["num_hidden_layers"] = layers
    return OrthrosConfig(window_size=window, max_position_embeddings=1 << 22, **kw)


def build_model(cfg, dtype, device):
    from ..models import OrthrosForCausalLM

    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = OrthrosForCausalLM(cfg)
    finally:
        torch.set_default_dtype(prev)
    return model.eval().requires_grad_(False)


def check_same_arguments(args, ctx: ParallelContext, device) -> None:
    """Every rank must run the same measurements in the same order: a ``ValueError`` on every rank, naming the
    options, when the ranks were given different arguments (launched by hand, or by a launcher that passes each
    its own); ``--out`` may differ (rank 0 alone writes it). One ``all_gather`` of a digest per option (their
    loops diverged and the first collective that no longer matched ran out the ``--timeout``, blaming a peer)."""
    if ctx.world_size == 1:
        return
    names = sorted(k for k in vars(args) if k != "out")
    digest = [int.from_bytes(hashlib.sha256(f"{k}={getattr(args, k)!r}".encode()).digest()[:8], "little", signed=True)
              for k in names]
    got = ctx.all_gather(torch.tensor(digest, dtype=torch.int64, device=device), "the ranks' arguments").cpu()
    differ = [k for i, k in enumerate(names) if bool((got[:, i] != got[0, i]).any())]
    if differ:
        others = [r for r in range(ctx.world_size) if not torch.equal(got[r], got[0])]
        opts = ", ".join(("--no-single" if k == "single" else "--" + k.replace("_", "-"))
                         + f" (rank {ctx.rank}: {getattr(args, k)!r})" for k in differ)
        raise ValueError(f"the ranks were given different arguments: {opts} differ between rank 0 and rank(s) "
                         f"{', '.join(map(str, others))}; every rank must get the same ones (torchrun passes its "
                         f"own to every rank)")


class Bench:
    def __init__(self, args, ctx: ParallelContext, device):
        self.args, self.ctx, self.device = args, ctx, device
        self.t0 = time.time()
        self.records = []
        self.cuda = device.type == "cuda"

    # -------------------------------------------------------------- plumbing
    def log(self, msg):
        if self.ctx.rank == 0:
            print(f"[{time.time() - self.t0:7.1f}s] {msg}", flush=True)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def save(self):
        if self.ctx.rank == 0 and self.args.out:  # atomically: a run killed mid-write keeps the last whole file
            write_json(self.args.out, dict(meta=self.meta, records=self.records), indent=1)

    def add(self, rec):
        self.records.append(rec)
        self.log(to_json(rec))
        self.save()

    def go(self, model: str, gpus: int, T: int) -> bool:
        """Rank 0 decides whether the run of ``model`` on ``gpus`` at ``T`` tokens, predicted from the
        measured ones, fits the time budget; every rank learns the same answer. A skipped run is recorded."""
        predicted_s = self.predict(model, gpus, T)
        skip = 0.0
        if self.ctx.rank == 0 and self.args.time_budget:
            skip = float(time.time() - self.t0 + predicted_s > self.args.time_budget)
        if self.ctx.all_reduce_max(skip, self.device, "time-budget decision") == 0.0:
            return True
        self.add(dict(model=model, gpus=gpus, tokens=T, status="skipped",
                      note=f"predicted {predicted_s:.3g} s at {time.time() - self.t0:.0f} s into the run: past "
                           f"--time-budget {self.args.time_budget:g}"))
        return False

    def timed(self, fn, ctx: ParallelContext):
        """Run ``fn`` on the ranks of ``ctx``: (seconds of the slowest rank, peak GiB per rank (None on the CPU: not
        measured there; it was recorded as 0.0), result)."""
        ctx.barrier("before timed run", self.device)
        self.sync()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        t = time.perf_counter()
        res = fn()
        self.sync()
        dt = time.perf_counter() - t
        dt = ctx.all_reduce_max(dt, self.device, "latency")
        if not self.cuda:  # every rank: the device is one for all
            return dt, None, res
        peak = torch.cuda.max_memory_allocated(self.device)
        peaks = ctx.all_gather(torch.tensor([float(peak)], dtype=torch.float64, device=self.device), "peak memory")
        return dt, [round(p / 2**30, 2) for p in peaks.view(-1).tolist()], res

    def ids(self, T):
        g = torch.Generator(device=self.device).manual_seed(T)
        return torch.randint(0, self.cfg.vocab_size, (1, T), device=self.device, generator=g)

    # -------------------------------------------------------------- phases
    def orthros(self, T, ctx: ParallelContext, label):
        sh = ShardedOrthros(self.model, ctx, chunk_size=self.args.chunk_size, key_chunk=self.args.key_chunk)
        ids = self.ids(T)
        holder = {}

        def run():
            logits, cache = sh.prefill(ids)
            holder["cache_bytes"] = cache.nbytes()
            holder["logits"] = logits
            return None

        try:
            dt, peaks, _ = self.timed(run, ctx)
        except torch.cuda.OutOfMemoryError as e:
            holder.clear()
            torch.cuda.empty_cache()
            return dict(model="orthros", gpus=ctx.world_size, tokens=T, status="OOM", note=str(e)[:200])
        cache = ctx.all_gather(torch.tensor([float(holder["cache_bytes"])], dtype=torch.float64,
                                            device=self.device), "cache bytes").view(-1).tolist()
        finite = bool(torch.isfinite(holder["logits"]).all())
        holder.clear()
        if self.cuda:
            torch.cuda.empty_cache()
        return dict(model="orthros", gpus=ctx.world_size, tokens=T, status="ok", latency_s=round(dt, 4),
                    tokens_per_s=round(T / dt, 1), peak_mem_gib=peaks,
                    kv_cache_gib=[round(c / 2**30, 2) for c in cache], logits_finite=finite, run=label)

    def transformer(self, T, ctx: ParallelContext, mesh=None):
        from .baseline import transformer_cp_prefill, transformer_prefill

        ids = self.ids(T)

        def run():
            if mesh is None:
                pos = torch.arange(T, device=self.device).view(1, T)
                out = transformer_prefill(self.model, ids, pos, chunk_size=self.args.chunk_size)
            else:
                out = transformer_cp_prefill(self.model, ids, mesh, chunk_size=self.args.chunk_size)
            del out
            return None

        try:
            dt, peaks, _ = self.timed(run, ctx)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            return dict(model="transformer", gpus=ctx.world_size, tokens=T, status="OOM", note=str(e)[:200])
        if self.cuda:
            torch.cuda.empty_cache()
        how = "SDPA (causal)" if mesh is None else "context_parallel ring attention"
        return dict(model="transformer", gpus=ctx.world_size, tokens=T, status="ok", latency_s=round(dt, 4),
                    tokens_per_s=round(T / dt, 1), peak_mem_gib=peaks, impl=how)

    def predict(self, model, gpus, T):
        pts = [(r["tokens"], r["latency_s"]) for r in self.records
               if r.get("model") == model and r.get("gpus") == gpus and r.get("status") == "ok"]
        if not pts:
            return 0.0
        t0, l0 = max(pts)
        p = 2 if model == "transformer" else 1
        return l0 * (T / t0) ** p if T > t0 else l0

    def check(self):
        """Sanity on the device: the sharded prefill's logits vs the model's own forward."""
        T = max(self.args.check_len, self.ctx.world_size)
        ids = self.ids(T)
        logits, _ = ShardedOrthros(self.model, self.ctx, chunk_size=self.args.chunk_size).prefill(ids)
        ref = self.model(ids, logits_to_keep=1, use_cache=False).logits
        err = float((logits.float() - ref.float()).norm() / ref.float().norm())
        agree = bool((logits[:, -1].argmax(-1) == ref[:, -1].argmax(-1)).all())
        errs = self.ctx.all_gather(torch.tensor([err], dtype=torch.float64, device=self.device), "check")
        self.add(dict(model="orthros", check="sharded prefill vs model forward", gpus=self.ctx.world_size, tokens=T,
                      rel_err_logits=[float(e) for e in errs.view(-1).tolist()], same_argmax=agree))

    def run(self):
        a, ctx = self.args, self.ctx
        N = ctx.world_size
        check_same_arguments(a, ctx, self.device)  # before any work: diverging ranks ran out the timeout
        self.cfg = model_config(a.model, a.layers, a.window)
        self.meta = dict(
            date=time.strftime("%Y-%m-%d"), commit=commit_id() or "unknown",
            torch=torch.__version__, python=platform.python_version(), world_size=N,
            device=torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
            model=a.model, layers=self.cfg.num_hidden_layers, dtype=a.dtype, window=a.window,
            chunk_size=a.chunk_size, backend=("nccl" if self.cuda else "gloo"),
        )
        self.model = build_model(self.cfg, parse_dtype(a.dtype, "--dtype"), self.device)
        n = sum(p.numel() for p in self.model.parameters())  # the tiny model in M (it read '0.00 B params')
        size = f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"
        self.log(f"model built ({size} params), world {N}")
        single = ParallelContext.single()
        # the other ranks wait while rank 0 measures a 1-GPU run, which may outlast the collectives'
        # --timeout: they wait in a group of their own, up to the time budget (a day without one)
        idle = ctx
        if N > 1:
            wait_s = max(a.timeout, a.time_budget) if a.time_budget else 86400.0
            idle = ParallelContext.from_group(dist.new_group(timeout=datetime.timedelta(seconds=wait_s)),
                                              timeout_s=wait_s)

        # warm-up (kernels, allocator) and a correctness check on the device
        self.orthros(max(a.warmup, N), ctx, "warmup")
        if N > 1 and a.single and ctx.rank == 0:
            self.orthros(a.warmup, single, "warmup")
        idle.barrier("after warm-up", self.device)
        self.check()

        for T in a.lengths:  # Orthros over all N ranks
            if self.go("orthros", N, T):
                self.add(self.orthros(T, ctx, "measured"))
        if N > 1 and a.single:  # Orthros on rank 0 alone
            for T in [t for t in a.lengths if t <= a.single_max]:
                if self.go("orthros", 1, T):
                    if ctx.rank == 0:
                        self.add(self.orthros(T, single, "measured"))
                    idle.barrier("after a 1-GPU run", self.device)
        if a.transformer:  # Transformer on 1 GPU
            if ctx.rank == 0:
                self.transformer(min(a.warmup, a.transformer[0]), single)
            idle.barrier("after a 1-GPU run", self.device)
            for T in a.transformer:
                if self.go("transformer", 1, T):
                    if ctx.rank == 0:
                        self.add(self.transformer(T, single))
                    idle.barrier("after a 1-GPU run", self.device)
        for T in a.extra_lengths:  # longer Orthros runs over N ranks
            if self.go("orthros", N, T):
                self.add(self.orthros(T, ctx, "measured"))
        if N > 1 and a.transformer_cp:  # Transformer with PyTorch context parallelism (risky: late)
            self.transformer_cp(a.transformer_cp)
        for T in a.transformer_late:  # long Transformer runs on 1 GPU, if the budget allows
            if self.go("transformer", 1, T):
                if ctx.rank == 0:
                    self.add(self.transformer(T, single))
                idle.barrier("after a 1-GPU run", self.device)
        self.summarize()

    def transformer_cp(self, lengths):
        ctx, N = self.ctx, self.ctx.world_size
        try:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(self.device.type, (N,))
            self.transformer(min(self.args.warmup, lengths[0]), ctx, mesh)
        except Exception as e:  # noqa: BLE001 - record why the baseline does not run here
            self.add(dict(model="transformer", gpus=N, status="error", impl="context_parallel",
                          note=f"{type(e).__name__}: {str(e)[:300]}"))
            return
        for T in lengths:
            if self.go("transformer", N, T):
                self.add(self.transformer(T, ctx, mesh))

    # -------------------------------------------------------------- report
    def summarize(self):
        if self.ctx.rank != 0:
            return
        N = self.ctx.world_size
        ok = [r for r in self.records if r.get("status") == "ok" and r.get("run", "measured") == "measured"]

        def get(model, gpus, T):
            for r in ok:
                if r["model"] == model and r["gpus"] == gpus and r["tokens"] == T:
                    return r
            return None

        # Transformer 1-GPU fit t = a T + b T^2 (least squares, needs >= 2 points)
        pts = [(r["tokens"], r["latency_s"]) for r in ok if r["model"] == "transformer" and r["gpus"] == 1]
        fit = None
        if len(pts) >= 2:
            A = torch.tensor([[t, t * t] for t, _ in pts], dtype=torch.float64)
            y = torch.tensor([l for _, l in pts], dtype=torch.float64)
            fit = torch.linalg.lstsq(A, y.view(-1, 1)).solution.view(-1).tolist()
        est = []
        lengths = sorted({r["tokens"] for r in ok if r["model"] == "orthros"})
        for T in lengths:
            for gpus in sorted({1, N}):
                if get("transformer", gpus, T) is None and fit is not None:
                    t1 = fit[0] * T + fit[1] * T * T
                    est.append(dict(model="transformer", gpus=gpus, tokens=T, status="estimate",
                                    latency_s=round(t1 / gpus, 3),
                                    note=("estimate: fit a*T+b*T^2 to measured 1-GPU SDPA latencies at "
                                          f"{[p[0] for p in pts]}" + (f", divided by {gpus} (ideal scaling, no "
                                                                      "communication: a lower bound)" if gpus > 1 else ""))))
        self.records.extend(est)
        self.save()

        def cell(r):
            if r is None:
                return "-"
            s = f"{r['latency_s']:.2f}"
            return s + (" (est.)" if r.get("status") == "estimate" else "")

        allr = ok + est
        g = lambda m, n, T: next((r for r in allr if r["model"] == m and r["gpus"] == n and r["tokens"] == T), None)  # noqa: E731

        def table_row(T, name):  # (header, cell) pairs; with one process the N-GPU columns would repeat the 1-GPU ones
            o1, oN, t1, tN = g("orthros", 1, T), g("orthros", N, T), g("transformer", 1, T), g("transformer", N, T)
            sc = f"{o1['latency_s'] / oN['latency_s']:.2f}x" if o1 and oN and N > 1 else "-"
            sp = f"{tN['latency_s'] / oN['latency_s']:.1f}x" if tN and oN else "-"
            if tN and tN.get("status") == "estimate" and sp != "-":
                sp += " (est.)"
            many = N > 1
            return [("tokens", name), ("Orthros 1 GPU (s)", cell(o1))] + (
                [(f"Orthros {N} GPU (s)", cell(oN)), ("scaling", sc)] if many else []) + [
                (f"mem/GPU {N} GPU (GiB)", "/".join(f"{m:.1f}" for m in oN["peak_mem_gib"]) if oN and oN["peak_mem_gib"] else "-"),
                ("KV/GPU (GiB)", "/".join(f"{m:.1f}" for m in oN["kv_cache_gib"]) if oN else "-"),
                ("Transformer 1 GPU (s)", cell(t1))] + (
                [(f"Transformer {N} GPU (s)", cell(tN))] if many else []) + [
                (f"Orthros {N} vs Transformer {N}", sp)]

        if not lengths:
            print(f"no Orthros length measured: no table (the records are in {self.args.out or 'no --out'})", flush=True)
            return
        rows = [table_row(T, f"{T // 1024}K" if T % 1024 == 0 else str(T)) for T in lengths]
        heads = [h for h, _ in rows[0]]
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(c for _, c in r) + " |" for r in rows]
        print("\n".join(lines), flush=True)


class _Parser(argparse.ArgumentParser):
    """Under ``torchrun`` every rank parses the same arguments: only rank 0 prints the usage error or the
    help (each rank printed its own copy), every rank exits with the same code. On an error the other ranks
    first wait (up to ``QUIET_RANK_WAIT_S``): torchrun stops every rank once one fails, which could be before
    rank 0 had printed anything; rank 0 meets the same error and its exit ends the wait."""

    QUIET_RANK_WAIT_S = 30.0

    @staticmethod
    def _quiet() -> bool:
        try:
            return int(os.environ.get("RANK", "0")) > 0
        except ValueError:  # not a rank torchrun set: print
            return False

    def print_usage(self, file=None):
        if not self._quiet():
            super().print_usage(file)

    def print_help(self, file=None):
        if not self._quiet():
            super().print_help(file)

    def exit(self, status=0, message=None):
        if self._quiet():
            if status:
                time.sleep(self.QUIET_RANK_WAIT_S)
            message = None
        super().exit(status, message)


def parse_args(argv=None) -> argparse.Namespace:
    """The checked arguments (``device`` resolved to ``"cuda"`` or ``"cpu"``); a bad one exits with a
    usage error before the process group starts."""
    p = _Parser(prog="python -m orthros.parallel.bench",
                description="Sequence-parallel prefill benchmark (launch with torchrun).")
    p.add_argument("--model", default="qwen3-8b", choices=["qwen3-8b", "tiny"],
                   help="architecture of the random-weight model: qwen3-8b or tiny (CPU runs) (default: %(default)s)")
    p.add_argument("--layers", type=positive_int, default=None, help="override the number of layers")
    p.add_argument("--window", type=positive_int, default=128, help="Orthros window (default: %(default)s)")
    p.add_argument("--dtype", default="bf16", choices=DTYPE_CHOICES,
                   help="weights and activations (default: %(default)s)")
    p.add_argument("--lengths", type=parse_lengths, default=parse_lengths("64K,128K,256K,512K"),
                   help="prompt lengths measured on all ranks, comma list with K / M suffixes (default: 64K,128K,256K,512K)")
    p.add_argument("--extra-lengths", type=parse_lengths, default=[],
                   help="Orthros-on-N-ranks lengths measured after the baselines (e.g. 1M)")
    p.add_argument("--single-max", type=parse_lengths, default=[512 * 1024],
                   help="longest length measured on 1 GPU")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the 1-GPU Orthros runs")
    p.add_argument("--transformer", type=parse_lengths, default=parse_lengths("64K,128K"),
                   help="Transformer lengths on 1 GPU ('' for none)")
    p.add_argument("--transformer-cp", type=parse_lengths, default=parse_lengths("64K,128K"),
                   help="Transformer lengths with PyTorch context parallelism on all ranks ('' for none)")
    p.add_argument("--transformer-late", type=parse_lengths, default=[],
                   help="Transformer lengths on 1 GPU measured last, if the time budget allows")
    p.add_argument("--warmup", type=positive_int, default=8192,
                   help="tokens of the warm-up prefill before the timed ones (default: %(default)s)")
    p.add_argument("--check-len", type=positive_int, default=4096,
                   help="tokens of the sanity check (sharded prefill against the model's own forward) (default: %(default)s)")
    p.add_argument("--chunk-size", type=positive_int, default=32768,
                   help="tokens per token-wise step within a shard (bounds activation memory) (default: %(default)s)")
    p.add_argument("--key-chunk", type=positive_int, default=65536,
                   help="keys per step of the output query's partial attention (default: %(default)s)")
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds; skip runs predicted to overrun")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="process-group timeout (s) of the collectives; ranks idle during a 1-GPU run wait up "
                        "to --time-budget (a day without one) (default: %(default)s)")
    p.add_argument("--device", default=None, choices=["cuda", "cpu"],
                   help="cuda or cpu (default: cuda if available; cpu needs --model tiny)")
    p.add_argument("--out", default="parallel_bench.json", help="results JSON (default: %(default)s)")
    a = p.parse_args(argv)
    if len(a.single_max) != 1:
        p.error(f"--single-max takes one length, got {a.single_max}")
    a.single_max = a.single_max[0]
    try:  # the process group's timedelta
        check_timeout("--timeout", a.timeout)
    except ValueError as e:
        p.error(str(e))
    if not 0 <= a.time_budget <= MAX_TIMEOUT_S:  # the idle ranks' group waits that long
        p.error(f"--time-budget must be >= 0 and <= {MAX_TIMEOUT_S:g} seconds (0 = no budget), got {a.time_budget:g}")
    try:  # torchrun's, known before the process group starts
        world = env_world_size()
    except ParallelError as e:
        p.error(str(e))
    if world == 1 and a.transformer_cp and a.transformer_cp != p.get_default("transformer_cp"):
        p.error("--transformer-cp runs the Transformer with context parallelism over several ranks; this run has "
                "one (launch with torchrun --nproc-per-node N >= 2, or use --transformer for 1-GPU lengths)")
    short = [T for T in a.lengths + a.extra_lengths if T < world]
    if short:
        p.error(f"--lengths / --extra-lengths must be >= the number of ranks ({world}): one token per rank; "
                f"got {short}")
    odd = [T for T in a.transformer_cp if T % (2 * world)] if world > 1 else []
    if odd:  # torch's context_parallel turns its head-tail load balancing off there, without a word
        p.error(f"--transformer-cp lengths must be multiples of 2 x the number of ranks ({2 * world}): PyTorch's "
                f"head-tail load balancing needs it; got {odd}")
    if a.out:
        try:
            check_output_path("--out", a.out)
        except ValueError as e:
            p.error(str(e))
        parent = os.path.dirname(os.path.abspath(a.out))
        if not os.path.isdir(parent):  # the JSON is written as records come in, so the folder must exist
            p.error(f"--out {a.out}: folder {parent} does not exist")
    if a.device == "cuda":
        try:
            check_device(a.device, "--device")
        except ValueError as e:
            p.error(str(e))
    use_cuda = (a.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    if not use_cuda and a.model == "qwen3-8b":  # 16 GB of bf16 weights, then prompts of 64K+ tokens on the CPU
        p.error("--model qwen3-8b is a GPU measurement; on the CPU" + ("" if a.device else " (no CUDA here)")
                + " use --model tiny (a smoke run)")
    a.device = "cuda" if use_cuda else "cpu"
    if a.device == "cpu" and a.transformer_cp:  # PyTorch shards only CUDA's SDPA kernels: an 'error' record, late
        if a.transformer_cp != p.get_default("transformer_cp"):
            p.error("--transformer-cp needs CUDA: PyTorch's context parallelism shards only the GPU's attention "
                    "kernels (the CPU's has no sharding strategy); on the CPU pass --transformer-cp ''")
        a.transformer_cp = []  # the default: the GPU baseline, not run on the CPU
    # no OOM to record on the CPU (CUDA's is a "status": "OOM" record): the kernel killed the ranks. One process a
    # host decides for its ranks (each measuring the free memory at its own moment, near the limit some refused and
    # others ran on); the others start the process group, which torchrun ends if that one refuses.
    if a.device == "cpu" and os.environ.get("LOCAL_RANK", "0") == "0":
        try:
            check_host_memory(a, world, env_local_world_size(world))
        except (ValueError, ParallelError) as e:
            p.error(str(e))
    return a


def count_parameters(cfg) -> int:
    """The parameters of ``OrthrosForCausalLM(cfg)``, exactly, without building its every layer: a model of ``L``
    layers of one kind (the bench's configs) has those of 1 layer and ``L - 1`` times what a second adds, counted
    on the meta device (``--layers 100000`` built 100000 layers there, minutes before any message)."""
    from ..models import OrthrosForCausalLM

    def count(c):
        with torch.device("meta"):
            return sum(p.numel() for p in OrthrosForCausalLM(c).parameters())

    L = cfg.num_hidden_layers
    if L <= 2 or len(set(cfg.layer_types)) != 1:
        return count(cfg)
    one, two = (count(cfg.__class__.from_dict({**cfg.to_dict(), "num_hidden_layers": n,
                                               "layer_types": cfg.layer_types[:n]}))
                for n in (1, 2))
    return one + (L - 1) * (two - one)


def check_host_memory(a, world: int, local: int | None = None, available=None) -> None:
    """CPU runs: refuse, before the process group starts, lengths whose KV cache cannot fit the host's free memory
    beside the weights of the ``local`` ranks on this host (of ``world``; default: all of them; each rank builds the
    model and holds its shard of the cache, ~``T / world`` tokens; ``available``: default
    :func:`orthros.utils.available_memory`, ``None``: unknown, not checked). A lower bound: no activations.
    A ``ValueError`` naming the option of the longest length and the longest that fits (was: the ranks killed by
    the kernel mid-run, no message)."""
    from ..utils import available_memory, format_bytes

    free = (available or available_memory)("cpu")
    if free is None or not a.lengths + a.extra_lengths:
        return
    local = world if local is None else local
    cfg = model_config(a.model, a.layers, a.window)
    item = parse_dtype(a.dtype, "--dtype").itemsize
    weights = local * item * count_parameters(cfg)
    # ShardedKVCache's K and V rows (sized here: parallel does not import engine's StaticKVCache, nor is it this cache)
    kvtok = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * item

    def here(T):  # this host's rows of a T-token prompt: its ranks' shards, the last rank's spare rows for decoding
        return min(T, local * -(-T // world)) + 256

    T = max(a.lengths + a.extra_lengths)
    need = weights + here(T) * kvtok
    if need <= free:
        return
    opt = "--lengths" if T in a.lengths else "--extra-lengths"
    rows = (free - weights) // kvtok - 256  # the prompt rows that fit here (less the spare ones)
    fits = rows if local == world else world * (rows // local)
    ranks = f"{local} rank{'s' if local > 1 else ''}" + (f" (of {world}) on this host" if local < world else "")
    raise ValueError(f"{opt}: a prompt of {T} tokens needs at least {format_bytes(need)} of host memory, more than "
                     f"the {format_bytes(free)} free: the weights of {ranks} take {format_bytes(weights)} and the "
                     f"KV cache {format_bytes(here(T) * kvtok)}; "
                     + (f"a prompt of at most {fits} tokens fits (activations not counted)" if fits >= world
                        else "no prompt fits beside the weights"))


def main(argv=None) -> int:
    a = parse_args(argv)
    use_cuda = a.device == "cuda"
    try:
        ctx = init_from_env("nccl" if use_cuda else "gloo", timeout_s=a.timeout)
        device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        Bench(a, ctx, device).run()
    except BaseException as e:  # noqa: BLE001 - one clear line per rank, then exit without hanging
        rank = os.environ.get("RANK", "0")
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C reaches every rank: each printed a traceback
            if rank == "0":
                saved = f"; the records measured so far are in {a.out}" if a.out and os.path.exists(a.out) else ""
                print(f"orthros.parallel.bench: interrupted{saved}", file=sys.stderr, flush=True)
            os._exit(130)
        print(f"orthros.parallel.bench: rank {rank} FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
