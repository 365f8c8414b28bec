"""Issue 46, item 6: the install path the systemd units expect.

`make install` puts a venv at PREFIX (default /opt/cachepilot) with this
checkout installed as a wheel, and links BINDIR/cachepilot (default
/usr/local/bin) to its command -- the path deploy/systemd/*.service run.
Here into a temporary PREFIX and BINDIR (dependencies from the package
index or pip's cache: about 40 s), then the installed command runs from
its own venv, and `systemd-analyze verify` passes on the units with
/usr/local/bin/cachepilot replaced by the temporary link.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
UNITS = sorted((REPO / "deploy" / "systemd").glob("*.service"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("make") is None or not Path("/usr/bin/python3").exists():
        pytest.skip("needs make and /usr/bin/python3")
    tmp = tmp_path_factory.mktemp("install")
    prefix, bindir = tmp / "opt" / "cachepilot", tmp / "bin"
    r = subprocess.run(["make", "-s", "install", f"PREFIX={prefix}", f"BINDIR={bindir}"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith(f"installed: {bindir}/cachepilot -> "
                                     f"{prefix}/bin/cachepilot"), r.stdout
    return prefix, bindir


@pytest.mark.slow
def test_make_install_puts_a_venv_at_prefix_and_links_its_command(installed):
    prefix, bindir = installed
    link = bindir / "cachepilot"
    assert link.is_symlink() and link.resolve() == (prefix / "bin" / "cachepilot").resolve()
    # the venv's own copy (a wheel, not an editable link back to the checkout)
    r = subprocess.run([str(prefix / "bin" / "python"), "-c",
                        "import cachepilot, cachepilot.models._mrc; print(cachepilot.__file__)"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith(str(prefix / "lib")), r.stdout
    assert any((prefix / "lib").glob("python3*/site-packages/cachepilot/agent/bpf/sampler"))
    r = subprocess.run([str(link), "certs", "--help"], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0 and "init" in r.stdout, r.stderr


@pytest.mark.slow
def test_units_verify_against_the_installed_command(installed, tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (make deps installs it)")
    _, bindir = installed
    units = []
    for unit in UNITS:
        text = unit.read_text()
        assert "ExecStart=/usr/local/bin/cachepilot " in text     # where make install links
        (tmp_path / unit.name).write_text(
            text.replace("/usr/local/bin/cachepilot", str(bindir / "cachepilot")))
        units.append(str(tmp_path / unit.name))
    assert len(units) == 2
    r = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    # ... and without the command there, verify fails: the check can fail
    (bindir / "cachepilot").unlink()
    try:
        r = subprocess.run([analyze, "verify", "--man=no", *units], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode != 0 and "is not executable" in r.stderr
    finally:
        (bindir / "cachepilot").symlink_to(installed[0] / "bin" / "cachepilot")
