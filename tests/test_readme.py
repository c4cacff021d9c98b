"""The README and docs stay true to the code: the README's Python usage runs as written, every
`orthros` command its command-line block names exists and answers --help, and every `orthros`
command of docs/*.md parses as written."""

import ast
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang):
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def test_python_usage_runs_as_written(tmp_path, monkeypatch, one_thread):
    (code,) = [b for b in blocks("python") if "import orthros" in b]
    monkeypatch.chdir(tmp_path)  # it saves "my-orthros" to the working directory
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert scope["o"].shape == (1, 512, 8, 64) and scope["o_out"].shape == (1, 4, 8, 64)
    assert scope["out"].shape == (2, 320)  # 300 prompt tokens + 20 new
    assert (tmp_path / "my-orthros" / "model.safetensors").is_file()


def help_text(capsys, argv):
    from orthros.cli import main

    try:
        code = main([*argv, "--help"])
    except SystemExit as e:  # argparse's --help
        code = e.code
    assert code in (0, None), argv
    return capsys.readouterr().out


def test_every_orthros_command_in_the_readme_exists(capsys):
    """Each `orthros ...` line of the README's shell blocks: its command (and sub-command) answers
    --help, every option the line shows is in that help, and `orthros train`'s are config keys."""
    from orthros.cli import COMMANDS
    from orthros.training.config import valid_keys

    keys = set(valid_keys())
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    lines = [line.strip().split("#")[0] for b in blocks("bash") for line in b.splitlines()
             if line.strip().startswith("orthros ")]
    named = {line.split()[1] for line in lines}
    assert {"convert", "train", "plot", "generate", "eval"} <= named <= set(COMMANDS), named - set(COMMANDS)
    checked = 0
    for line in lines:
        words = line.split()[1:]
        cmd = words[0]
        for i, seg in enumerate(line.split(" | ")):  # eval's line: "eval mqar [...] | niah --model PATH | ..."
            argv = [cmd]
            if cmd in ("bench", "eval"):  # the options belong to a sub-command
                argv.append((words[1] if i == 0 else seg.split()[0]).split("|")[0])
            text = help_text(capsys, argv)
            assert f"orthros {' '.join(argv)}" in text or f"orthros {cmd}" in text, argv
            for flag in re.findall(r"(?<![\w-])--([a-z][a-z_.-]*)", seg):
                if cmd == "train" and flag not in ("resume", "help-config", "dry-run"):  # a config key, or "--key value"
                    assert flag == "key" or flag in keys or leaves.count(flag) == 1, flag
                else:
                    assert f"--{flag}" in text, (argv, flag)
                checked += 1
    assert checked >= 15


def script_help(monkeypatch, capsys, script):
    """``python SCRIPT --help``'s text, run in this process (torch is imported once)."""
    import runpy
    import sys

    monkeypatch.setattr(sys, "argv", [script, "--help"])
    try:
        runpy.run_path(str(README.parent / script), run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), script
    return capsys.readouterr().out


def test_every_benchmark_script_line_runs_as_written(monkeypatch, capsys):
    """Each `python benchmarks/X.py ...` line of the README's shell blocks: every option it shows is
    in the script's --help, and every option the script requires is on the line."""
    lines = [line.strip().split("  #")[0] for b in blocks("bash") for line in b.splitlines()
             if line.strip().startswith("python benchmarks/")]
    assert len(lines) >= 4
    for line in lines:
        script = line.split()[1]
        text = script_help(monkeypatch, capsys, script)
        usage = text.split("\n\n")[0]
        while re.search(r"\[[^\[\]]*\]", usage):  # drop the optional groups, nested ones too
            usage = re.sub(r"\[[^\[\]]*\]", "", usage)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", usage):
            assert flag in line.split(), (line, f"{flag} is required")
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", line):
            assert flag in text, (line, flag)


def test_progress_switches_are_where_the_readme_says(capsys):
    """The README said `--no-progress` turns progress off for the commands other than convert,
    fetch and train; `generate --prompts` and `bench` show it and take no such option. If one of
    them gains a switch, the README's list changes with it."""
    text = " ".join(README.read_text().split())
    assert "`--no-progress` (`demo`; `eval` lm, mqar, niah, niah-train, ppl), `-q` (`convert`, `fetch`)" in text
    assert "(`generate --prompts` and `bench` have no such switch)" in text
    for argv, flag in ((["demo"], "--no-progress"), (["eval", "lm"], "--no-progress"), (["eval", "mqar"], "--no-progress"),
                       (["eval", "niah"], "--no-progress"),
                       (["eval", "niah-train"], "--no-progress"), (["eval", "ppl"], "--no-progress"),
                       (["convert"], "--quiet"), (["fetch"], "--quiet")):
        assert flag in help_text(capsys, argv), argv
    for argv in (["generate"], ["bench", "prefill"], ["bench", "decode"], ["bench", "e2e"], ["bench", "all"]):
        h = help_text(capsys, argv)
        assert "--no-progress" not in h and "--quiet" not in h, argv


def doc_commands():
    """``(page, line)`` for each `orthros ...` command in a code block of docs/*.md, a
    backslash-continued command joined into one line; in a block of ``$ ``-prompted lines only
    those lines (the others are the command's output), an environment assignment before it dropped."""
    out = []
    for page in sorted((README.parent / "docs").glob("*.md")):
        for block in re.findall(r"^ *```[a-z]*\n(.*?)^ *```", page.read_text(), flags=re.S | re.M):
            prompted = any(line.lstrip().startswith("$ ") for line in block.splitlines())
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                s = line.strip()
                if prompted and not s.startswith("$ "):
                    continue
                s = re.sub(r"^(\$ )?(\w+=\S* )*", "", s)
                if s.startswith("orthros "):
                    out.append((page.name, s))
    return out


def test_every_orthros_command_in_the_docs_parses(capsys, monkeypatch):
    """Each `orthros ...` command of docs/*.md, as written, gets through its command's argparse
    (no unknown option, no bad choice, every required argument), and `orthros train`'s options
    are config keys. Parsing is where it stops: nothing runs."""
    import argparse
    import shlex

    from orthros.cli import main
    from orthros.training.config import valid_keys

    class Parsed(BaseException):  # past every `except Exception` of a command's main
        pass

    parse, depth = argparse.ArgumentParser.parse_known_args, [0]

    def parse_then_stop(self, args=None, namespace=None):
        depth[0] += 1  # a sub-command's parser is called inside its parent's
        try:
            result = parse(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise Parsed(result)
        return result

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_then_stop)
    keys = set(valid_keys())
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    commands, bad = doc_commands(), []
    for page, line in commands:
        argv = shlex.split(re.split(r"\s#\s|\s&$", line)[0])[1:]
        if argv[0] == "train":
            for flag in (a[2:] for a in argv[1:] if a.startswith("--")):
                if flag not in ("resume", "help-config", "dry-run") and flag not in keys and leaves.count(flag) != 1:
                    bad.append(f"{page}: {line}: --{flag} is no config key")
            continue
        try:
            main(argv)
            bad.append(f"{page}: {line}: never parsed its arguments")
        except Parsed as p:
            _, extra = p.args[0]
            if extra:
                bad.append(f"{page}: {line}: unrecognized {extra}")
        except SystemExit as e:
            bad.append(f"{page}: {line}: exit {e.code}: {capsys.readouterr().err.strip().splitlines()[-1:]}")
    assert not bad, "\n".join(bad)
    named = {line.split()[1] for _, line in commands}
    assert {"convert", "generate", "eval", "info", "train", "bench"} <= named, named


PACKAGE = README.parent / "orthros"
ENTRY_POINTS = ("__main__", "train")  # `python -m orthros` / `python -m orthros.train`: they run orthros.cli


def components():
    """The package's parts: each module directly in orthros/ and each sub-package, by name."""
    return ({f.stem for f in PACKAGE.glob("*.py")}
            | {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()})


def layer_rows():
    """docs/design.md's "Layers of the package" table: the parts each row names, the top row first."""
    section = (README.parent / "docs" / "design.md").read_text().split("## Layers of the package")[1].split("\n## ")[0]
    rows = [re.findall(r"`([^`]+)`", line.split("|")[1]) for line in section.splitlines() if line.startswith("| `orthros")]
    return section, [{n.removeprefix("orthros/").removesuffix(".py") for n in row} for row in rows]


def orthros_imports(path):
    """(line, the part of orthros) of every import of ``path`` from another part of orthros, lazy ones too;
    an import of the package itself (its ``__version__``, or ``import orthros`` to register it) is none."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    here = ["orthros", *rel[:-1]]  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            mod = base + (node.module.split(".") if node.module else [])
            targets = [mod] if node.module else [mod + [a.name] for a in node.names]
        else:
            continue
        for t in targets:
            if t[0] == "orthros" and len(t) > 1 and t[1] in components() and t[1] != rel[0]:
                yield node.lineno, t[1]


def test_the_package_layout_matches_the_tree_and_imports_go_down():
    """docs/design.md's table places every module of orthros/ and every sub-package (and README's
    "Package layout" names them), and each imports only from the rows above its own: ops nothing of
    layers or models, layers nothing of models, the model nothing of the engine, and so on. The modules
    that let a command refuse a wrong path before torch loads import none at their top."""
    section, rows = layer_rows()
    rank = {name: i for i, row in enumerate(rows) for name in row}
    assert set(rank) <= components(), set(rank) - components()
    for name in ENTRY_POINTS:
        assert f"`{name}.py`" in section, name
        rank[name] = rank["cli"] + 1
    assert components() <= set(rank), f"placed in no row of docs/design.md: {sorted(components() - set(rank))}"
    layout = README.read_text().split("## Package layout")[1]
    for name in components() - {"__init__", *ENTRY_POINTS}:
        assert re.search(rf"`(orthros/)?{name}(\.py)?`", layout), f"README's Package layout does not name {name}"
    upward = [f"{f.relative_to(PACKAGE.parent)}:{line} imports orthros.{t}"
              for f in sorted(PACKAGE.rglob("*.py")) for line, t in orthros_imports(f)
              if rank[t] >= rank[f.relative_to(PACKAGE).with_suffix("").parts[0]]]
    assert not upward, upward
    for module in ("checkpoint_files.py", "conversion/checks.py", "utils.py", "kinds.py", "layout.py", "cli.py",
                   "__init__.py"):
        top = [a.name if isinstance(node, ast.Import) else node.module or ""
               for node in ast.parse((PACKAGE / module).read_text()).body
               if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names]
        assert not [m for m in top if m.split(".")[0] in ("torch", "transformers", "numpy", "safetensors")], module
