"""Call 4 (CUDA): sampling after 8aa39e8 (the row maximum subtracted before the temperature).
A tiny temperature samples the argmax on the device for bf16 / fp32 logits of a real vocabulary
size, and the engine's sampled decode (CUDA graphs on) gives the same tokens for the same seed
twice and the greedy tokens at temperature 1e-45."""
import torch

from orthros.engine import Engine, SamplingParams, sample
from orthros.models import OrthrosConfig, OrthrosForCausalLM

dev = torch.device("cuda")
print("card:", torch.cuda.get_device_name(), flush=True)
g = torch.Generator(device=dev).manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    logits = (torch.randn(8, 151936, device=dev) * 4).to(dtype)
    want = logits.float().argmax(-1)
    for t in (1e-45, 1e-30, 1e-6):
        for kw in ({}, dict(top_k=50), dict(top_p=0.9)):
            got = sample(logits, SamplingParams(temperature=t, **kw), g)
            assert torch.equal(got, want), (dtype, t, kw)
print("sample: tiny temperatures give the argmax (bf16, fp32; top-k / top-p on and off)", flush=True)

torch.manual_seed(0)
cfg = OrthrosConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, window_size=16, max_position_embeddings=1024)
model = OrthrosForCausalLM(cfg).to(dev, torch.bfloat16).eval()
eng = Engine(model, max_batch_size=2, max_seq_len=256)
prompts = [[1, 5, 9, 2, 7] * 10, [3, 4, 8] * 7]
greedy = eng.generate(prompts, 24)
tiny = eng.generate(prompts, 24, SamplingParams(temperature=1e-45, seed=1))
a = eng.generate(prompts, 24, SamplingParams(temperature=0.8, top_p=0.95, seed=7))
b = eng.generate(prompts, 24, SamplingParams(temperature=0.8, top_p=0.95, seed=7))
assert tiny == greedy, (tiny, greedy)
assert a == b
print(f"engine (CUDA graphs {eng.cuda_graphs if hasattr(eng, 'cuda_graphs') else '?'}): temperature 1e-45 == greedy; "
      f"seeded sampling repeats; sampled differs from greedy: {a != greedy}", flush=True)
print("OK")
