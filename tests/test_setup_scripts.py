"""scripts/*.sh as README gives them: as root they run; otherwise they run again through sudo."""

import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["setup.sh", "test.sh", "run-foreground.sh"]


def _bin(tmp_path, uid, with_sudo):
    """A PATH of this test's own: `id` answering uid, the tools the scripts need, and a `sudo`
    that only prints what it was asked to run (when with_sudo)."""
    path = tmp_path / "bin"
    path.mkdir()
    for tool in ("dirname", "basename"):
        os.symlink(subprocess.check_output(["sh", "-c", f"command -v {tool}"], text=True).strip(), path / tool)
    (path / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if with_sudo:
        (path / "sudo").write_text('#!/bin/sh\necho "sudo $*"\n')
    for tool in path.iterdir():
        tool.chmod(0o755)
    return str(path)


def _run(script, path, *args):
    bash = subprocess.check_output(["sh", "-c", "command -v bash"], text=True).strip()
    return subprocess.run([bash, f"scripts/{script}", *args], cwd=ROOT, env={"PATH": path},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_user_gets_the_script_again_through_sudo(tmp_path, script):
    done = _run(script, _bin(tmp_path, 1000, with_sudo=True), "-k", "two words")
    assert done.returncode == 0, done.stderr
    assert f"{script}: not root: running it again through sudo" in done.stderr
    assert done.stdout == f"sudo bash {ROOT}/scripts/{script} -k two words\n"


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_user_without_sudo_is_told_to_run_it_as_root(tmp_path, script):
    done = _run(script, _bin(tmp_path, 1000, with_sudo=False))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"{script}: needs root (temperd changes other processes' scheduling) "
                           "and sudo is not installed: run it as root\n")


def test_readme_and_ci_run_the_same_test_command_without_sudo():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read().splitlines()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read().splitlines()
    command = next(line for line in readme if line.startswith("bash scripts/test.sh"))
    assert command in ci
    assert next(line for line in readme if line.startswith("bash scripts/run-foreground.sh"))
    assert not any(line.startswith("sudo bash scripts/") for line in readme + ci)
