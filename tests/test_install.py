"""The installer (tools/install.sh) and what runs it: the GitHub Action (action.yml),
the Containerfile and .ci/run.

.ci/run runs the installer for real on every CI run; these tests check the action's
step hands its inputs to it, and the installer's plan (--dry-run) for given faces.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSTALL = ROOT / "tools" / "install.sh"


def load_action() -> dict:
    """action.yml parsed by PyYAML: this Python's, or else Debian's python3-yaml."""
    text = (ROOT / "action.yml").read_text()
    try:
        import yaml
    except ImportError:
        yaml = None
    if yaml is not None:
        return yaml.safe_load(text)
    code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin.read())))"
    try:
        r = subprocess.run(["/usr/bin/python3", "-c", code], input=text, capture_output=True,
                           text=True, timeout=60)
    except OSError:
        r = None
    if r is None or r.returncode:
        why = "needs PyYAML (Debian: python3-yaml) to parse action.yml"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    import json
    return json.loads(r.stdout)


def test_action_is_a_composite_step_running_the_installer():
    action = load_action()
    assert action["name"] == "softnic" and action["description"]
    assert set(action["inputs"]) == {"faces", "packages", "hugepages", "python", "env"}
    steps = action["runs"]["steps"]
    assert action["runs"]["using"] == "composite" and len(steps) == 1
    step = steps[0]
    assert step["shell"] == "bash"
    assert '"$GITHUB_ACTION_PATH/tools/install.sh"' in step["run"]
    # every input reaches the step, and every output comes from it
    for name in action["inputs"]:
        assert f"${{{{ inputs.{name} }}}}" in step["env"].values(), name
    for out in action["outputs"].values():
        assert out["value"].startswith(f"${{{{ steps.{step['id']}.outputs.")


def test_action_step_passes_its_inputs(tmp_path):
    """The step's script, run by bash with the inputs as GitHub gives them, against a
    stand-in installer that prints its arguments."""
    step = load_action()["runs"]["steps"][0]
    fake = tmp_path / "action" / "tools" / "install.sh"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = dict(os.environ, GITHUB_ACTION_PATH=str(tmp_path / "action"),
               RUNNER_TEMP=str(tmp_path / "tmp"))
    inputs = {"faces": "c rdmacm,ucx", "packages": "valgrind", "hugepages": "8",
              "python": "python3.12", "env": "SOFTNIC_FAULTS=loss=0.01\nSOFTNIC_SEED=3\n"}
    for key, value in step["env"].items():
        m = re.fullmatch(r"\$\{\{ inputs\.(\w+) \}\}", value)
        env[key] = inputs[m.group(1)]
    r = subprocess.run(["bash", "-e", "-c", step["run"]], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "--faces", "c rdmacm,ucx", "--packages", "valgrind", "--hugepages", "8",
        "--python", "python3.12", "--venv", str(tmp_path / "tmp" / "softnic-venv"),
        "--env", "SOFTNIC_FAULTS=loss=0.01", "--env", "SOFTNIC_SEED=3"]


def dry_run(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(INSTALL), "--dry-run", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_dry_run_prints_the_packages_of_the_faces(tmp_path):
    r = dry_run("--faces", "rdmacm", "--packages", "valgrind", "--venv", str(tmp_path / "v"))
    assert r.returncode == 0, r.stderr
    debs = re.search(r"^Debian packages: (.*)$", r.stdout, re.M).group(1).split()
    debs = [d for d in debs if d != "python3-venv"]     # when python3 is Debian's
    assert debs == ["gcc", "python3-dev", "libibverbs-dev", "ibverbs-utils", "librdmacm-dev",
                    "rdmacm-utils", "valgrind"]
    plan = [line for line in r.stdout.splitlines() if line.startswith("+ ")]
    venv = tmp_path / "v"
    assert plan[-4:] == [f"+ python3 -m venv {venv}", f"+ {venv}/bin/pip install -q -e {ROOT}",
                         f"+ env -u PYTHONDONTWRITEBYTECODE {venv}/bin/python -m compileall -q "
                         f"-j 0 {ROOT}/softnic {ROOT}/verbs_api {ROOT}/congestion",
                         f"+ {venv}/bin/softnic doctor --face rdmacm"]
    assert f'export PATH="{venv}/bin:$PATH"' in r.stdout
    assert not venv.exists()                            # a dry run changes nothing
    r = dry_run("--faces", "middleware", "--no-doctor", "--extras", "test")
    debs = re.search(r"^Debian packages: (.*)$", r.stdout, re.M).group(1).split()
    assert {"ucx-utils", "openmpi-bin", "libopenmpi-dev", "python3-mpi4py"} <= set(debs)
    assert "librdmacm-dev" not in debs
    assert "softnic doctor" not in r.stdout and f"-e {ROOT}[test]" in r.stdout


def test_dry_run_writes_nothing_for_github(tmp_path):
    gh_path, gh_env = tmp_path / "path", tmp_path / "env"
    env = dict(os.environ, GITHUB_PATH=str(gh_path), GITHUB_ENV=str(gh_env))
    r = dry_run("--faces", "c", "--env", "SOFTNIC_FAULTS=loss=0.01", env=env)
    assert r.returncode == 0, r.stderr
    assert 'export SOFTNIC_FAULTS="loss=0.01"' in r.stdout
    assert not gh_path.exists() and not gh_env.exists()


@pytest.mark.parametrize("args, message", [
    (("--faces", "nosuch"), "unknown face 'nosuch'"),
    (("--hugepages", "many"), "--hugepages wants a number"),
    (("--env", "PATH=/x"), "--env wants SOFTNIC_NAME=value"),
    (("--bogus",), "unknown argument --bogus")])
def test_bad_arguments(args, message):
    r = dry_run(*args)
    assert r.returncode == 2 and message in r.stderr


def test_ci_and_the_container_run_the_installer():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^tools/install\.sh .*--faces \"all tests\"", ci, re.M)
    assert "apt-get" not in ci                  # every package comes through the installer
    # .ci/run still ends with README's test command, verbatim
    readme = (ROOT / "README.md").read_text()
    last = ci.strip().splitlines()[-1]
    assert last.startswith("python3 -m venv .venv") and last in readme
    container = (ROOT / "Containerfile").read_text()
    assert "/opt/softnic/tools/install.sh" in container and "softnic doctor" in container


def test_installer_shell_syntax():
    r = subprocess.run(["bash", "-n", str(INSTALL)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.access(INSTALL, os.X_OK)


def test_docs_workflow_uses_the_action_as_it_is():
    """docs/ci.md's workflow: valid YAML, the action's step with inputs it has, faces the
    installer knows, and every program step under softnic exec."""
    import json
    text = (ROOT / "docs" / "ci.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S).group(1)
    code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin.read())))"
    try:
        import yaml
        flow = yaml.safe_load(block)
    except ImportError:
        r = subprocess.run(["/usr/bin/python3", "-c", code], input=block, capture_output=True,
                           text=True, timeout=60)
        if r.returncode:
            load_action()                       # skips (fails in CI) without PyYAML
        flow = json.loads(r.stdout)
    steps = next(iter(flow["jobs"].values()))["steps"]
    action = [s for s in steps if s.get("uses", "").endswith("/softnic@main")]
    assert len(action) == 1
    assert set(action[0]["with"]) <= set(load_action()["inputs"])
    from softnic.cli import packages
    assert packages.expand([action[0]["with"]["faces"]]) == ["ucx", "mpi"]
    runs = [s["run"] for s in steps if "run" in s]
    assert any("softnic exec $MPIRUN ./ring" in r for r in runs)
    for r in runs:
        if "mpirun" in r or "ucx_info" in r or "MPIRUN" in r:
            assert r.strip().startswith("softnic exec "), r


def test_readme_lists_the_packages_the_installer_installs():
    """README's list of Debian packages for the tests is packages.py's (all faces and the
    tests'), the list .ci/run installs through tools/install.sh."""
    from softnic.cli import packages
    readme = (ROOT / "README.md").read_text()
    text = re.search(r"Debian's packages: (.*?); without them", readme, re.S).group(1)
    assert sorted(re.findall(r"`([a-z0-9.+-]+)`", text)) == sorted(
        packages.packages(["all", "tests"]))
