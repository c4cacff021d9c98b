"""Call 2 (diagnosis): the plain preload form gave NaN logits in the engine's GPU test
(tests/engine/test_engine_preload.py, plain, eager and compiled) while its op tests and the
merge form passed. The test's eager case, one setting changed at a time, plus the kernel
alone at the test's shape (N = K = 2048: 16 rows a block on 132 SMs)."""
import sys

import torch

sys.path.insert(0, "tests")
from conftest import fed_decode, tiny_model  # noqa: E402

from orthros.ops.gemv import preload  # noqa: E402

torch.manual_seed(0)
for M, pieces, group in [(2, 12, 2), (2, 12, 1), (2, 16, 2), (1, 12, 2)]:
    x = torch.randn(M, 2048, device="cuda").bfloat16()
    w = (torch.randn(2048, 2048, device="cuda") * 0.05).bfloat16()
    part = torch.full((1, M, 2048), float("nan"), device="cuda")
    preload.launch(x, w, part, x.stride(0), pdl=False, pieces=pieces, group=group)
    err = (part[0].double() - x.double() @ w.double().T).abs().max().item()
    print(f"kernel alone M={M} pieces={pieces} group={group}: max err {err:.3g}", flush=True)

m = tiny_model(0, dtype=torch.bfloat16, hidden_size=2048, intermediate_size=1024, head_dim=128,
               num_attention_heads=16, num_key_value_heads=4, window_size=16, qk_norm=True,
               num_hidden_layers=2, attention_mode="orthros", vocab_size=512).cuda()
prompt = [[(7 * i + 3) % 500 + 1 for i in range(300)]]
kw = dict(max_batch_size=1, max_seq_len=512, compile=False, gemv=True)
keep = {n: getattr(preload, n) for n in ("PIECES", "EARLY_COMBINE", "MERGE", "GROUP", "FIT_STAGES")}
preload.PIECES = 0
want, fed = fed_decode(m, prompt, 5, **kw)
print("want finite:", torch.isfinite(want).all().item(), flush=True)
for name, change in [("base (pieces 12, early, group 2, fit)", {}), ("early off", {"EARLY_COMBINE": False}),
                     ("group 1", {"GROUP": 1}), ("fit off", {"FIT_STAGES": False}), ("pieces 1", {"PIECES": 1}),
                     ("early off + fit off", {"EARLY_COMBINE": False, "FIT_STAGES": False}),
                     ("merge form", {"MERGE": True})]:
    for n, v in keep.items():
        setattr(preload, n, v)
    preload.PIECES, preload.EARLY_COMBINE, preload.MERGE = 12, True, False
    for n, v in change.items():
        setattr(preload, n, v)
    try:
        got, _ = fed_decode(m, prompt, 5, tokens=fed, **kw)
        finite = [bool(torch.isfinite(g).all()) for g in got]
        err = (got.float() - want.float()).abs().nan_to_num(float("inf")).amax(dim=tuple(range(1, got.dim())))
        print(f"{name}: finite by step {finite}, max err by step {[round(e, 3) for e in err.tolist()]}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__}: {e}", flush=True)
