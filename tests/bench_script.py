"""``load_script``: a benchmark script (``benchmarks/*.py``, not a package) as a module, for the
tests that call its functions in-process. A module of its own, not ``conftest``: tests/serving's
conftest takes that name in a full run, before the modules collected after it import."""

import importlib.util


def load_script(path, name: str):
    """The script at ``path`` imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
