"""FLOP counting for MFU, and the metrics sinks (JSONL always, TensorBoard when installed)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import TYPE_CHECKING, Optional

from ..layout import METRICS
from ..utils import named_os_error, to_json

if TYPE_CHECKING:
    import torch

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s.
_PEAKS_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "H800": 989.4e12, "A100": 312e12, "A800": 312e12,
               "L40S": 362e12, "B200": 2250e12, "GB200": 2500e12, "MI300X": 1307e12}


def detect_peak_flops(device: torch.device, precision: str) -> Optional[float]:
    """Peak FLOP/s of one device for the given precision, or None if unknown (e.g. CPU)."""
    if device.type != "cuda" or precision != "bf16":
        return None
    import torch  # here, so that `orthros plot` (which reads metrics) starts without torch

    name = torch.cuda.get_device_name(device)
    for key, val in _PEAKS_BF16.items():
        if key in name:
            return val
    return None


def window_keys(L: int, w: int) -> int:
    """sum_{t=0}^{L-1} min(t+1, w): keys seen by a causal sliding window of w over L tokens."""
    if L <= w:
        return L * (L + 1) // 2
    return w * (w + 1) // 2 + (L - w) * w


def train_flops(model_cfg, seg_lens: list, n_out: int) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward) on one packed batch.

    Counts what the architecture needs, not recomputation (activation checkpointing), not the
    embedding lookup and not the norms or activations. ``n_out``: scored positions (output-stream
    tokens for Orthros). With an output stream, every layer sees the T base tokens plus the
    ``n_out`` output tokens. Per layer kind (``model_cfg.layer_types``):

    * attention: its projections (2 FLOPs a weight a token), and 4 x heads x head_dim FLOPs a
      (query, key) pair: a causal window over every base token plus, for Orthros, full causal
      attention for the output tokens;
    * Gated DeltaNet (Orthros-H, Linear Hybrid, GDN): its projections, the depthwise convolution
      (2 x channels x kernel a base token) and the gated delta rule in its recurrent form, 6 x key
      x value head dims a value head a base token (read, update, output); an output token costs
      its query and gate projections, one read of the state (2 x key x value head dims a value
      head) and ``out_proj``. The chunked kernels' extra intra-chunk work is not counted, as the
      attention kernels' masked-out blocks are not;
    * every layer: the SwiGLU MLP; the LM head on the ``n_out`` scored positions.

    Every layer is counted with both streams, as the paper's count (Section 3.3) does. The model
    skips the last layer's base stream (only that layer's keys and values of the base tokens are
    read again), so an Orthros count is above the work done by that stream's MLP, query and output
    projections and window: 1.5-1.7% of a 1.3B pre-training step at 2048 tokens, ~3% of an 8K prefill
    (SmolLM2-135M and Qwen3-8B shapes), so the Transformer ratios `orthros info` prints err low.
    """
    return 3.0 * sum(forward_flops(model_cfg, seg_lens, n_out).values())


def forward_flops(model_cfg, seg_lens: list, n_out: int, *, out_keys=None) -> dict:
    """The forward FLOPs :func:`train_flops` counts, by part: ``mlp``, ``attention_projections``,
    ``attention`` (the (query, key) pairs), ``gdn`` (Gated DeltaNet layers) and ``lm_head``.
    ``out_keys``: the keys all output queries attend to together, when known (a prefill's one
    output query, at the last of ``T`` tokens, attends to ``T``); by default each output query
    is taken at an average position (``n_out / T`` of the causal pairs)."""
    c = model_cfg
    d, H, KV, hd, I, V = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                          c.intermediate_size, c.vocab_size)
    T = sum(seg_lens)
    mode = getattr(c, "attention_mode", "full")
    extra = n_out if mode == "orthros" else 0  # output tokens through every layer
    types = list(getattr(c, "layer_types", None) or ["attention"] * c.num_hidden_layers)
    n_linear = sum(t == "linear_attention" for t in types)
    n_attn = len(types) - n_linear
    mlp = 2 * 3 * d * I * (T + extra) * len(types)
    attn_proj = 2 * (d * H * hd * 2 + d * KV * hd * 2) * (T + extra) * n_attn
    full_keys = sum(s * (s + 1) // 2 for s in seg_lens)
    win_keys = sum(window_keys(s, c.window_size) for s in seg_lens)
    if mode == "orthros":
        keys = win_keys + (full_keys * (n_out / max(T, 1)) if out_keys is None else out_keys)
    elif mode == "window":
        keys = win_keys
    else:
        keys = full_keys
    attn = 4 * H * hd * keys * n_attn
    gdn = 0
    if n_linear:
        hk, hv = c.linear_num_key_heads, c.linear_num_value_heads
        dk, dv, kernel = c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim
        key_dim, value_dim = hk * dk, hv * dv
        conv_dim = 2 * key_dim + value_dim
        base = (2 * d * (conv_dim + value_dim + 2 * hv) + 2 * value_dim * d  # in_proj_qkv, _z, _b, _a; out_proj
                + 2 * conv_dim * kernel + 6 * hv * dk * dv)
        out = 2 * d * (key_dim + value_dim) + 2 * value_dim * d + 2 * hv * dk * dv
        gdn = (base * T + out * extra) * n_linear
    head = 2 * d * V * n_out
    return {"mlp": mlp, "attention_projections": attn_proj, "attention": attn, "gdn": gdn, "lm_head": head}


class MetricsLogger:
    """Appends one JSON object per line to ``metrics.jsonl``; mirrors scalars to TensorBoard."""

    def __init__(self, output_dir: str, enabled: bool = True, tensorboard: bool = True,
                 resume_step: Optional[int] = None):
        """``resume_step``: the run continues from a checkpoint of this step (0: a fresh start), so
        the rows a killed run logged after it are dropped (those steps run again and log again)."""
        self.enabled, self._failed = enabled, False
        self.path = os.path.join(output_dir, METRICS)
        if enabled and resume_step is not None:
            drop_rows_after(self.path, resume_step)
        self._f = open(self.path, "a", encoding="utf-8") if enabled else None
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                purge = None if resume_step is None else resume_step + 1
                self._tb = SummaryWriter(os.path.join(output_dir, "tensorboard"), purge_step=purge)
            except Exception:  # noqa: BLE001 - tensorboard not installed
                self._tb = None

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time(), 3), **record}
        try:
            self._f.write(to_json(record) + "\n")  # a NaN / inf as null: standard JSON
            self._f.flush()
        except OSError as e:  # a full disk: `[Errno 28] No space left on device` named no file
            self._failed = True
            raise named_os_error(e, self.path, "cannot log a row") from e
        if self._tb is not None:
            step = record.get("step", 0)
            for k, v in record.items():
                if k not in ("step", "time", "kind") and isinstance(v, (int, float)):
                    self._tb.add_scalar(f"{record.get('kind', 'train')}/{k}", v, step)

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()  # (flushes what a failed row left in the buffer: that failure again)
            except OSError as e:
                if not self._failed:
                    raise named_os_error(e, self.path, "cannot log a row") from e
        if self._tb is not None:
            self._tb.close()


def drop_rows_after(path: str, step: int) -> int:
    """Remove the rows of ``metrics.jsonl`` logged for steps after ``step`` (rewritten through a
    temporary file and a rename, so a crash leaves the old or the new file). Returns how many."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as f:  # bytes: a damaged one spoils its line only, as in read_metrics
        lines = f.readlines()
    keep = []
    for line in lines:
        try:
            rec = json.loads(line.decode("utf-8", errors="replace"))
        except json.JSONDecodeError:  # a line torn by a kill mid-write
            continue
        if not (isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] > step):
            keep.append(line if line.endswith(b"\n") else line + b"\n")
    dropped = len(lines) - len(keep)
    if keep != lines:  # also a last line without its newline: the next row appended would join it
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.writelines(keep)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:  # Ctrl-C, a full disk: the old file stays, and no temporary one beside it
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return dropped


def read_metrics(output_dir: str, kind: Optional[str] = "train") -> list[dict]:
    """The rows of ``output_dir/metrics.jsonl`` of one ``kind`` (train / eval; None: every row),
    in order; a line torn by a kill mid-write is skipped."""
    rows = []
    # a damaged byte spoils its line only (skipped as a torn one), not the file
    with open(os.path.join(output_dir, METRICS), encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and (kind is None or rec.get("kind") == kind):
                rows.append(rec)
    return rows

