"""Hub names in a training config (``model.init_from``, ``data.tokenizer``, ``data.train``):
refused at once, naming the key, when the hub cannot be reached; offline they used to wait out
the hub client's retries (about 50 s for a tokenizer) and fail with a network error."""

from __future__ import annotations

import re
import socket

import pytest

pytest.importorskip("datasets", reason="training needs the `datasets` package")

from orthros.training.config import ConfigError, load_config  # noqa: E402
from orthros.training.hub import check_hub_name, hub_unreachable  # noqa: E402
from orthros.training.trainer import dry_run  # noqa: E402

from test_trainer import corpus, tiny  # noqa: E402,F401


@pytest.fixture
def offline(monkeypatch):
    def no_dns(host, *a, **k):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    hub_unreachable.cache_clear()
    yield
    hub_unreachable.cache_clear()


def test_unreachable_when_offline_or_unresolved(monkeypatch, offline):
    assert "huggingface.co does not resolve" in hub_unreachable()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_unreachable.cache_clear()
    assert hub_unreachable() == "HF_HUB_OFFLINE is set"
    with pytest.raises(ConfigError, match=r"^data.tokenizer: 'org/tok' is not a local path, and as a hub tokenizer"):
        check_hub_name("data.tokenizer", "org/tok", "tokenizer")


def test_reachable_when_the_host_resolves(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.example.org")
    seen = []
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: seen.append(host) or [])
    hub_unreachable.cache_clear()
    try:
        assert hub_unreachable() is None and seen == ["hub.example.org"]
        check_hub_name("model.init_from", "org/model", "model")  # no error: left to transformers
    finally:
        hub_unreachable.cache_clear()


@pytest.mark.parametrize("key,value,what,kind", [
    ("--model.init_from", "no-such-org/no-such-model", "model.init_from", "model"),  # said 'a hub tokenizer'
    ("--data.tokenizer", "no-such-org/no-such-tokenizer", "data.tokenizer", "tokenizer"),
    ("--data.train", "no-such-org/no-such-dataset", "data.train", "dataset"),
])
def test_a_config_naming_the_hub_offline_fails_at_once(tmp_path, corpus, offline, key, value, what, kind):  # noqa: F811
    """Our error (before any hub client runs: it would have raised its own), naming the key and what
    it names (model.init_from's own tokenizer is looked up first: it was called 'a hub tokenizer')."""
    extra = ["--mode", "cpt"] if key == "--model.init_from" else []
    with pytest.raises(ConfigError, match=rf"^{what}: '{value}' is not a local path, and as a hub {kind} .*unreachable"):
        dry_run(load_config(None, tiny(tmp_path / "run", corpus, *extra, key, value)))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["./tok", "../tok", "/no/such/tok", "~/tok", "a/b/c", "-tok", "org/.."])
def test_a_missing_local_path_is_no_hub_name(monkeypatch, name):
    """A path that does not exist was taken for a hub id: offline 'is not a local path, and ... the
    hub is unreachable', online the hub client's own error about repo ids."""
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: [])  # the hub would be reachable
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_unreachable.cache_clear()
    try:
        with pytest.raises(ConfigError, match=rf"^data.tokenizer: '{re.escape(name)}' does not exist \(no such local "
                                              rf"path; nor is it a hub tokenizer name\)"):
            check_hub_name("data.tokenizer", name, "tokenizer")
        for ok in ("gpt2", "HuggingFaceTB/SmolLM2-135M", "org_1/tok.v2"):
            check_hub_name("data.tokenizer", ok, "tokenizer")
    finally:
        hub_unreachable.cache_clear()


def test_a_hub_init_from_brings_its_own_tokenizer(tmp_path, corpus, monkeypatch):  # noqa: F811
    """With model.init_from a hub name and data.tokenizer left at 'embedded', the run tokenized its
    data with the embedded 4,096-token tokenizer, not the model's own (a local checkpoint's own
    tokenizer was already preferred): the hub model's tokenizer is loaded, under model.init_from."""
    import orthros.data as data_mod
    from orthros.training.trainer import load_tokenizer

    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: [])  # the hub would be reachable
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_unreachable.cache_clear()
    asked = []

    def fake_load(name=None):
        asked.append(name)
        raise OSError("no network in tests")

    monkeypatch.setattr(data_mod, "load_tokenizer", fake_load)
    try:
        cfg = load_config(None, tiny(tmp_path / "run", corpus, "--mode", "cpt",
                                     "--model.init_from", "HuggingFaceTB/SmolLM2-135M"))
        with pytest.raises(ConfigError, match=r"^model.init_from: cannot load the tokenizer "
                                              r"'HuggingFaceTB/SmolLM2-135M'"):
            load_tokenizer(cfg)
        assert asked == ["HuggingFaceTB/SmolLM2-135M"]
    finally:
        hub_unreachable.cache_clear()
