"""The shared test helpers stay importable: test modules import them with ``from conftest import``.

pytest imports every ``conftest.py`` under the module name ``conftest``. A second one below
tests/ therefore shadows tests/conftest.py for every module collected after it, and those
modules fail at import (this happened once: a tests/evaluation/conftest.py broke the layers,
models, ops and parallel tests). tests/serving/conftest.py is the one allowed: its modules run
in their own environment (tests/serving/run_vllm_tests.sh).
"""

import ast
from pathlib import Path

TESTS = Path(__file__).parent
ALLOWED = {TESTS / "conftest.py", TESTS / "serving" / "conftest.py"}


def test_no_conftest_shadows_the_shared_one():
    found = set(TESTS.rglob("conftest.py"))
    extra = sorted(str(p.relative_to(TESTS)) for p in found - ALLOWED)
    assert not extra, (
        f"{extra}: put shared fixtures in tests/conftest.py; another conftest.py shadows it for "
        "the modules that `from conftest import` its helpers")


def test_every_name_imported_from_conftest_is_defined_there():
    tree = ast.parse((TESTS / "conftest.py").read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Name)}
    users = 0
    for path in TESTS.rglob("*.py"):
        if path.parent.name == "serving":
            continue
        text = path.read_text()
        if "conftest" not in text:  # no import of it (parsing every test file took seconds)
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module == "conftest":
                users += 1
                missing = [a.name for a in node.names if a.name not in defined]
                assert not missing, f"{path.relative_to(TESTS)} imports {missing} from conftest"
    assert users, "no test module imports from conftest: this test checks nothing"


def test_conftest_is_imported_only_where_it_is_the_shared_one():
    """pytest collects tests/ in name order, and tests/serving/conftest.py is imported as `conftest`
    when tests/serving/ is collected. From then on `from conftest import` finds the serving one: in
    a module collected after it (tests/test_*.py, tests/training/) and in any function body (run
    after all collection). tests/test_paper_fidelity.py did both and failed at import in the suite."""
    bad = []
    for path in TESTS.rglob("*.py"):
        rel = path.relative_to(TESTS)
        if rel.parts[0] == "serving" or path.name == "conftest.py":
            continue
        text = path.read_text()
        if "conftest" not in text:  # no import of it (parsing every test file took seconds)
            continue
        tree = ast.parse(text)
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "conftest":
                if id(node) not in top:
                    bad.append(f"{rel}:{node.lineno} (inside a function: runs after tests/serving/ is collected)")
                elif rel.parts[0] > "serving":
                    bad.append(f"{rel}:{node.lineno} (a module collected after tests/serving/)")
    assert not bad, bad
