"""benchmarks/smollm2_gpu.sh's part2 / more on a warm machine ($HOME kept between calls), with a
stand-in for the protocol (``python3 .../smollm2_cpt.py``) that keeps its one rule about --work: a
call with the convert phase refuses a --work that holds an earlier run's CPT folders. The GGUF is a
few bytes, so its checksum is a stand-in too."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/smollm2_gpu.sh"

# the protocol's stand-in: refuses as smollm2_cpt.py's _check_run does, else "trains" into --work
PROTOCOL = r"""#!/usr/bin/env bash
if [[ "${1:-}" != */smollm2_cpt.py ]]; then exec "$REAL_PYTHON" "$@"; fi
shift
work= phases=convert,probe,train,ppl,niah
while [ $# -gt 0 ]; do
  case "$1" in --work) work=$2; shift ;; --phases) phases=$2; shift ;; --phases=*) phases=${1#--phases=} ;; esac
  shift
done
echo "protocol --work $work --phases $phases"
if [[ ",$phases," == *,convert,* ]]; then
  if [ -d "$work/orthros_cpt" ]; then echo "error: --work $work holds an earlier run's CPT (orthros_cpt)" >&2; exit 2; fi
  mkdir -p "$work/orthros_zero" "$work/orthros_cpt" && echo "$RUN" > "$work/orthros_cpt/run"
elif [ ! -d "$work/orthros_zero" ]; then echo "error: no conversion of an earlier call in --work $work" >&2; exit 2
fi
"""


@pytest.fixture
def machine(tmp_path):
    if not (shutil.which("bash") and shutil.which("tar") and shutil.which("gzip")):
        pytest.skip("needs bash, tar and gzip")
    home, checkout, stubs, out = (tmp_path / n for n in ("home", "checkout", "stubs", "out"))
    for d in (home / "smol/src", home / "smol/site", checkout / ".gpu", stubs, out):
        d.mkdir(parents=True)
    (home / "smol/gguf.partA").write_bytes(b"GGUF")  # part 1's half, kept in $HOME
    (checkout / ".gpu/gguf.partB").write_bytes(b"-tail")
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text('{"documents": 1}')
    subprocess.run(["tar", "-czf", str(checkout / ".gpu/data.tar.gz"), "-C", str(data), "."], check=True)
    (stubs / "python3").write_text(PROTOCOL)
    (stubs / "sha256sum").write_text("#!/usr/bin/env bash\ncat > /dev/null\n")  # the real GGUF's checksum only
    for f in stubs.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "HOME": str(home), "OUT": str(out), "REAL_PYTHON": sys.executable,
           "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}"}

    def call(*args, run="1"):
        return subprocess.run(["bash", str(SCRIPT), *args], cwd=checkout, env={**env, "RUN": run},
                              capture_output=True, text=True, timeout=120)

    call.work = home / "smol/work"
    return call


def test_part2_again_starts_a_fresh_run_and_keeps_the_earlier_one(machine):
    """A second part2 on the warm machine was refused by the protocol ('--work .../work holds an
    earlier run's CPT'), the only way on being to know to remove $HOME/smol/work by hand. part2
    starts a run afresh: the earlier run's folder is moved aside (not mixed, not deleted), said on
    stderr, and `more` continues the new run."""
    first = machine("part2", "--phases", "convert,probe,train", run="1")
    assert first.returncode == 0, first.stderr
    again = machine("part2", "--phases", "convert,probe,train", run="2")
    assert again.returncode == 0, again.stderr
    assert (machine.work / "orthros_cpt/run").read_text().strip() == "2"
    earlier = machine.work.with_name("work.earlier")
    assert (earlier / "orthros_cpt/run").read_text().strip() == "1"
    assert str(earlier) in again.stderr and "more" in again.stderr
    more = machine("more", "--phases", "train,ppl,niah")
    assert more.returncode == 0, more.stderr
    assert (machine.work / "orthros_cpt/run").read_text().strip() == "2"


@pytest.mark.parametrize("phases", [["--phases", "train,ppl"], ["--phases=ppl,niah"]])
def test_part2_without_convert_continues_the_run_in_work(machine, phases):
    """A part2 whose phases leave convert out continues the run in --work (as `more` does): that
    folder is not moved aside."""
    assert machine("part2", "--phases", "convert,probe", run="1").returncode == 0
    r = machine("part2", *phases)
    assert r.returncode == 0, r.stderr
    assert (machine.work / "orthros_cpt/run").read_text().strip() == "1"
    assert not machine.work.with_name("work.earlier").exists()
