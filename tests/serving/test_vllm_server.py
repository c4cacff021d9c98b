"""``vllm serve`` of a tiny Orthros checkpoint on 127.0.0.1, through vLLM's OpenAI-compatible
API: completions and chat (plain, streaming, concurrent) give the greedy tokens of
``OrthrosForCausalLM.generate()``; bad requests get vLLM's normal errors and the server keeps
serving; the server is shut down at the end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

if not os.environ.get("ORTHROS_REQUIRE_VLLM"):  # the vLLM step of CI sets it: there, no vLLM is a failure
    pytest.importorskip("vllm")
requests = pytest.importorskip("requests")

from vllm_support import BLOCK_SIZE, MAX_MODEL_LEN, WINDOW  # noqa: E402

NAME = "orthros-tiny"
NEW = 10
START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 60) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


@pytest.fixture(scope="module")
def server(orthros_checkpoint, tmp_path_factory):
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_ENABLE_V1_MULTIPROCESSING", "TRITON_INTERPRET")}
    cmd = [str(Path(sys.executable).parent / "vllm"), "serve", str(orthros_checkpoint), "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", NAME, "--dtype", "float32",
           "--max-model-len", str(MAX_MODEL_LEN), "--block-size", str(BLOCK_SIZE),
           "--kv-cache-memory-bytes", str(64 << 20), "--max-num-seqs", "8"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{_tail(log_path)}")
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not healthy after {START_TIMEOUT_S} s:\n{_tail(log_path)}")
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this test started: the server and its workers
            proc.wait(timeout=30)
    assert proc.returncode is not None


@pytest.fixture(scope="module")
def tokenizer(orthros_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(orthros_checkpoint)


def _post(url, route, body, **kw):
    return requests.post(url + route, json={"model": NAME, **body}, timeout=120, **kw)


def _greedy(n=NEW):
    return {"max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True}


def _complete(url, prompt, n=NEW):
    r = _post(url, "/v1/completions", {"prompt": prompt, **_greedy(n)})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _stream(url, route, body):
    """Token ids and text of a streamed answer (server-sent events)."""
    ids, text = [], []
    with _post(url, route, {**body, "stream": True}, stream=True) as r:
        assert r.status_code == 200, r.text
        for line in r.iter_lines(decode_unicode=True):
            if not line or not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            for choice in json.loads(data)["choices"]:
                ids += choice.get("token_ids") or []
                text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return ids, "".join(text)


def test_completions_equal_generate(server, reference, prompt_of, tokenizer):
    for i, n in enumerate([5, WINDOW, WINDOW + 1, 60]):
        prompt = prompt_of(n, seed=100 + i)
        choice = _complete(server, prompt)
        assert choice["token_ids"] == reference(prompt, NEW), f"prompt length {n}"
        assert choice["finish_reason"] == "length"
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"
    choice = _complete(server, text)
    ids = tokenizer(text).input_ids
    assert len(ids) > WINDOW
    assert choice["token_ids"] == reference(ids, NEW)
    assert choice["text"] == tokenizer.decode(choice["token_ids"])


def test_chat_equals_generate(server, reference, tokenizer):
    messages = [{"role": "system", "content": "You answer in verse."},
                {"role": "user", "content": "Who art thou, that comest in the night?"}]
    r = _post(server, "/v1/chat/completions", {"messages": messages, **_greedy()})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert body["prompt_token_ids"] == list(ids)
    choice = body["choices"][0]
    assert choice["token_ids"] == reference(ids, NEW)
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"])


def test_streaming_equals_generate(server, reference, prompt_of, tokenizer):
    prompt = prompt_of(40, seed=110)
    ids, text = _stream(server, "/v1/completions", {"prompt": prompt, **_greedy()})
    assert ids == reference(prompt, NEW)
    assert text == tokenizer.decode(ids)
    messages = [{"role": "user", "content": "Speak the speech, I pray you."}]
    chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    ids, text = _stream(server, "/v1/chat/completions", {"messages": messages, **_greedy()})
    assert ids == reference(list(chat_ids), NEW)
    assert text == tokenizer.decode(ids)


def test_concurrent_requests_equal_generate(server, reference, prompt_of):
    prompts = [prompt_of(n, seed=120 + i) for i, n in enumerate([120, 7, 33, WINDOW + 1])]
    results, errors = {}, []

    def client(i):
        try:
            time.sleep(0.05 * i)  # staggered arrivals, overlapping in the engine
            if i % 2:
                results[i] = _stream(server, "/v1/completions", {"prompt": prompts[i], **_greedy(20)})[0]
            else:
                results[i] = _complete(server, prompts[i], 20)["token_ids"]
        except Exception as e:  # reported below, in the test's thread
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    for i, p in enumerate(prompts):
        assert results[i] == reference(p, 20), f"request {i} (prompt length {len(p)})"


@pytest.mark.parametrize("body, status, words", [
    ({"prompt": list(range(10, 10 + MAX_MODEL_LEN + 20)), "max_tokens": 4}, 400, "maximum context length"),
    ({"prompt": [11, 12], "max_tokens": 4, "temperature": -1}, 400, "temperature"),
    ({"prompt": [11, 12], "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": [11, 12], "max_tokens": 4, "top_p": 1.5}, 400, "top_p"),
    ({"prompt": [11, 12], "max_tokens": 4, "prompt_logprobs": 1}, 400, "prompt_logprobs"),
    ({"prompt": [11, 12], "max_tokens": 4, "model": "no-such-model"}, 404, "does not exist"),
])
def test_bad_request_gets_vllm_error_and_server_keeps_serving(server, reference, prompt_of, body, status, words):
    r = requests.post(server + "/v1/completions", json={"model": NAME, **body}, timeout=60)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]
    prompt = prompt_of(25, seed=130)
    assert _complete(server, prompt)["token_ids"] == reference(prompt, NEW)


def test_logprobs_of_generated_tokens_equal_the_model(server, reference, prompt_of):
    """Sample logprobs come from the output stream's logits: those of the HF model."""
    import torch

    prompt = prompt_of(30, seed=140)
    r = _post(server, "/v1/completions", {"prompt": prompt, "logprobs": 2, **_greedy(4)})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids = choice["token_ids"]
    assert ids == reference(prompt, 4)
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected.tolist(), abs=1e-4)
