"""Run a function on N gloo ranks in fresh processes (tests, CPU): every rank's result or error
comes back, and ranks still running after ``join_timeout`` are killed and reported as hung.

The processes are forked from a ``forkserver`` that imported torch and orthros once (per calling
process): each spawned one imported them again, ~10 s of CPU a rank on a loaded 2-core machine."""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
import time
import traceback

import torch


# imported once by the fork server, which then forks each rank (as a DataLoader forks its workers after these
# imports; the server itself runs nothing of torch's)
_PRELOAD = ["torch", "orthros.parallel"]

_outdir = None  # in a rank: where run_ranks collects the ranks' results and errors


def _others_failed(rank: int, world: int) -> bool:
    """(in a rank) whether every other rank of this run has reported its error."""
    return all(os.path.exists(os.path.join(_outdir, f"rank{r}.err")) for r in range(world) if r != rank)


def _worker(rank, world, init_file, fn, kwargs, outdir, timeout_s, environ):
    global _outdir
    _outdir = outdir
    os.environ.clear()  # the caller's environment now, as a spawned process has (the server's is its start's)
    os.environ.update(environ)
    torch.set_num_threads(1)
    import torch.distributed as dist

    from .comm import ParallelContext

    code = 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=_dt.timedelta(seconds=timeout_s))
        ctx = ParallelContext.from_group(timeout_s=timeout_s)
        res = fn(ctx, **kwargs)
        ctx.barrier("end of run")
        torch.save(res, os.path.join(outdir, f"rank{rank}.pt"))
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - report everything to the parent
        code = 1
        with open(os.path.join(outdir, f"rank{rank}.err"), "w") as f:
            f.write(f"{type(e).__name__}: {e}\n\n{traceback.format_exc()}")
    os._exit(code)  # never block in a destructor waiting for a dead peer


def run_ranks(fn, world_size: int, *, timeout_s: float = 30.0, join_timeout: float = 120.0, **kwargs):
    """Start ``world_size`` processes running ``fn(ctx, **kwargs)`` (a module-level function).

    Returns a dict: ``results`` (rank -> value or None), ``errors`` (rank -> message),
    ``exitcodes``, ``hung`` (ranks killed after ``join_timeout``) and ``elapsed`` seconds.
    """
    import torch.multiprocessing as mp

    mpctx = mp.get_context("forkserver")
    mpctx.set_forkserver_preload(_PRELOAD)  # read when the server starts, at the first call
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "rendezvous")
        procs = [mpctx.Process(target=_worker, args=(r, world_size, init_file, fn, kwargs, d, timeout_s,
                                                     dict(os.environ)))
                 for r in range(world_size)]
        t0 = time.time()
        for p in procs:
            p.start()
        for p in procs:
            p.join(max(0.0, join_timeout - (time.time() - t0)))
        elapsed = time.time() - t0
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        results, errors = {}, {}
        for r in range(world_size):
            pt, err = os.path.join(d, f"rank{r}.pt"), os.path.join(d, f"rank{r}.err")
            results[r] = torch.load(pt, weights_only=False) if os.path.exists(pt) else None
            if os.path.exists(err):
                with open(err) as f:
                    errors[r] = f.read()
        return dict(results=results, errors=errors, exitcodes=[p.exitcode for p in procs], hung=hung,
                    elapsed=elapsed)


def case_generate(ctx, model_dir, cases, fail=None, sizes=None):
    """Load the model from ``model_dir`` (fp32) and run sharded greedy generation for each
    ``(input_ids, max_new_tokens, chunk_size)`` in ``cases[size]``, on the sub-group of the first
    ``size`` ranks for each ``size`` in ``sizes`` (default: the whole world), so one set of
    processes checks several world sizes. Returns ``{size: [result per case]}`` (ranks outside a
    sub-group have no entry for it). ``fail = {"rank", "layer", "mode": "raise"|"stall",
    "stall_s"}`` injects a failure into that rank's MLP of that layer: an error, or a stall until every
    other rank has failed (their collectives timed out), at most ``stall_s`` seconds."""
    import torch.distributed as dist

    from ..models import OrthrosForCausalLM
    from .comm import ParallelContext
    from .sharded import ShardedOrthros

    model = OrthrosForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if fail and fail["rank"] == ctx.rank:
        mlp = model.model.layers[fail["layer"]].mlp
        orig = mlp.forward

        stalled = []

        def broken(*args, **kwargs):
            if fail["mode"] == "raise":
                raise RuntimeError(f"injected failure on rank {ctx.rank}")
            if not stalled:  # stall once, then carry on as if nothing happened
                stalled.append(True)
                end = time.monotonic() + fail.get("stall_s", 10)
                while time.monotonic() < end and not _others_failed(ctx.rank, ctx.world_size):
                    time.sleep(0.05)
            return orig(*args, **kwargs)

        mlp.forward = broken
    sizes = [ctx.world_size] if sizes is None else list(sizes)
    results = {}
    for size in sizes:
        if size == ctx.world_size:
            sub = ctx
        else:  # every rank creates every group, in the same order
            group = dist.new_group(list(range(size)))
            if ctx.rank >= size:
                continue
            sub = ParallelContext.from_group(group, timeout_s=ctx.timeout_s)
        out = []
        for ids, n_new, chunk in cases[size]:
            sh = ShardedOrthros(model, sub, chunk_size=chunk, reserve=2)
            toks, logits, cache = sh.generate(ids, n_new)
            out.append(dict(tokens=toks, logits=logits, local_len=cache.length, bounds=cache.bounds,
                            window_rows=cache.window_k[0].shape[1]))
        results[size] = out
    return results
