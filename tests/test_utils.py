"""orthros.utils: save_figure writes through a temporary name and leaves nothing behind on failure."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from orthros.utils import save_figure  # noqa: E402


def test_save_figure_writes_a_png_and_no_temporary(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    out = tmp_path / "sub" / "plot.png"
    save_figure(fig, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["plot.png"]
    assert not plt.fignum_exists(fig.number)  # closed


def test_save_figure_failure_leaves_no_file(tmp_path):
    fig, _ = plt.subplots()
    with pytest.raises(ValueError):
        save_figure(fig, tmp_path / "plot.notaformat")
    assert list(tmp_path.iterdir()) == []


def test_write_json_is_atomic_and_makes_its_folder(tmp_path):
    import json

    from orthros.utils import write_json

    p = tmp_path / "a" / "b" / "r.json"
    write_json(p, {"x": 1, "p": tmp_path}, default=str)
    assert json.loads(p.read_text()) == {"x": 1, "p": str(tmp_path)}
    assert [f.name for f in p.parent.iterdir()] == ["r.json"]  # no temporary left beside it


def test_commit_id_prefers_the_environment(monkeypatch):
    from orthros.utils import commit_id

    monkeypatch.setenv("ORTHROS_COMMIT", "abc1234")
    assert commit_id() == "abc1234"
    monkeypatch.delenv("ORTHROS_COMMIT")
    c = commit_id()  # this checkout's HEAD (or None outside git)
    assert c is None or (c and c != "abc1234")
