"""Names the training config may resolve on the Hugging Face hub (``model.init_from``,
``data.tokenizer``, ``data.train`` / ``data.eval``), refused at once when the hub cannot be
reached.

A name that is not a local path is handed to transformers / datasets as a hub id. Offline, their
hub client retries each file for about 25 s before it fails, and its error speaks of the
network, not of the config key. :func:`check_hub_name` makes that failure immediate and names
the key: the hub is unreachable when ``HF_HUB_OFFLINE`` is set or its host does not resolve
(checked once a process).
"""

from __future__ import annotations

import functools
import os
import re
import socket
from urllib.parse import urlparse

from .config import ConfigError

# a hub id: a name or owner/name of letters, digits, '_', '-', '.', neither starting nor ending
# with '-' or '.', no '--' or '..' (huggingface_hub's rule); './x', '~/x', '/x', 'a/b/c' are paths
_PART = r"(?!.*(?:--|\.\.))[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?"
HUB_ID = re.compile(rf"(?:{_PART}/)?{_PART}")


@functools.lru_cache(maxsize=None)
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached, or ``None`` when it may be (its host resolves)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as e:
        return f"{host} does not resolve: {e}"
    return None


def check_hub_name(key: str, name: str, what: str) -> None:
    """``name`` (not a local path) is about to be looked up on the hub as ``what``: a
    :class:`~orthros.training.config.ConfigError` naming ``key`` when the hub is unreachable, or
    when ``name`` cannot be a hub id (a local path that does not exist)."""
    if not HUB_ID.fullmatch(name):
        raise ConfigError(f"{key}: {name!r} does not exist (no such local path; nor is it a hub {what} name)")
    why = hub_unreachable()
    if why is not None:
        raise ConfigError(f"{key}: {name!r} is not a local path, and as a hub {what} it cannot be fetched: "
                          f"the hub is unreachable ({why})")


__all__ = ["HUB_ID", "check_hub_name", "hub_unreachable"]
