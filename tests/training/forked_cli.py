"""``python -m orthros.train ARGS`` in a process of its own, forked from a ``forkserver`` that imported
torch, transformers and orthros once and bundled the remote code once (per pytest worker), instead of a
fresh interpreter each time (~5-10 s of imports a run on a loaded 2-core machine, most of a tiny run).

The child is a real process: it runs the module as ``__main__`` (``runpy``, as ``-m`` does) with the
caller's environment, working directory and arguments, its stdout and stderr going to files; it ends
with the exit code the interpreter would give (``SystemExit``'s code; a traceback and 1 for an uncaught
error), after multiprocessing's finalizers (as the interpreter's exit runs them), or dies of a
signal, or ``os._exit``s (the training fault hook). The tests that are about the
interpreter entry point itself (torchrun's launcher, ``__main__``) keep starting one."""

import os
import subprocess
import sys
import tempfile
import time

# what the fork server imports once (a module of this list that fails to import is skipped by it)
_PRELOAD = ["torch", "orthros.parallel", "orthros.cli", "orthros.training.cli", "orthros.training.trainer",
            "forked_cli"]


def _warm():
    """(on import, in the server) what every run does first: the tokenizer's imports, the remote code."""
    try:
        import orthros.data
        import orthros.models  # noqa: F401
        from orthros.models import OrthrosConfig

        orthros.data.load_tokenizer()
        with tempfile.TemporaryDirectory() as d:
            OrthrosConfig().save_pretrained(d)
    except Exception:  # noqa: BLE001 - a warm-up only: the run itself reports any error
        pass


if os.environ.get("ORTHROS_FORKED_CLI_SERVER") == "1":  # the fork server's import, not the caller's
    _warm()


def _child(module, argv, env, cwd, out, err, fsize):
    import runpy
    import traceback

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    if fsize is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    sys.argv = [module, *argv]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise  # multiprocessing ends the process with its code, as the interpreter does
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit 1
        traceback.print_exc()
        sys.exit(1)


def run_module(module, argv, *, env=None, cwd=None, max_file_bytes=None, timeout=600):
    """Run ``python -m module *argv`` in a forked process; a ``subprocess.CompletedProcess`` (text)."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    env = dict(os.environ if env is None else env)
    os.environ["ORTHROS_FORKED_CLI_SERVER"] = "1"  # read by the server if this call starts it
    try:
        ctx.set_forkserver_preload(_PRELOAD)  # (no effect once a server runs: it imports what it lacks)
        with tempfile.TemporaryDirectory() as d:
            out, err = os.path.join(d, "stdout"), os.path.join(d, "stderr")
            for path in (out, err):  # (a child that fails before it opens them: empty outputs, its exit code)
                open(path, "w").close()
            p = ctx.Process(target=_child, args=(module, list(argv), env, os.getcwd() if cwd is None else str(cwd),
                                                 out, err, max_file_bytes))
            t0 = time.time()
            p.start()
            p.join(timeout)
            if p.is_alive():
                p.kill()
                p.join()
                raise subprocess.TimeoutExpired([module, *argv], time.time() - t0)
            with open(out, encoding="utf-8", errors="replace") as f, open(err, encoding="utf-8", errors="replace") as g:
                return subprocess.CompletedProcess([module, *argv], p.exitcode, f.read(), g.read())
    finally:
        del os.environ["ORTHROS_FORKED_CLI_SERVER"]
