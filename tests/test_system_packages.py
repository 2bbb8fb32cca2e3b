"""tools/system-packages.sh, which the README's two commands run first: on a Debian-like system
it installs exactly the packages that are missing (as root, or through sudo without a prompt),
and where it cannot it names them and the command, and lets the set-up go on. Driven with stub
dpkg-query, apt-get, id and sudo on PATH, so the test changes nothing on the machine."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "system-packages.sh"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def run(tmp_path, purpose: str, *, installed: set[str], uid: int, sudo: str | None, codename: str = "jammy",
        mesa: str = "25.0.7-2~bpo12+1", refused: str = ""):
    """`installed`: what the stub dpkg-query says is there (mesa-vulkan-drivers at version `mesa`);
    `codename`: the system's release (bookworm: Debian 12); the stub apt-get fails any command that
    names `refused` (a package the release lacks, or an unreachable repository)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "apt.log"
    listed = " ".join(sorted(installed))
    stub(bin_dir, "dpkg-query", f'for p in {listed}; do [ "$p" = "$3" ] && {{ [ "$2" = "-f=\\${{Version}}" ] && '
                                f'printf "{mesa}" || printf "install ok installed"; exit 0; }}; done; exit 1\n')
    (tmp_path / "os-release").write_text(f"ID=debian\nVERSION_CODENAME={codename}\n")
    (tmp_path / "apt" / "sources.list.d").mkdir(parents=True, exist_ok=True)
    fail = f'case " $* " in *" {refused} "*) exit 100;; esac\n' if refused else ""
    stub(bin_dir, "apt-get", f'echo "apt-get $*" >> {log}\n{fail}')
    stub(bin_dir, "id", f"echo {uid}\n")
    stub(bin_dir, "tee", f'cat > "$1"\n')
    if sudo == "ok":
        stub(bin_dir, "sudo", '[ "$1" = -n ] && shift; [ "$1" = true ] && exit 0; "$@"\n')
    elif sudo == "asks":
        stub(bin_dir, "sudo", "exit 1\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "VOCABLE_OS_RELEASE": str(tmp_path / "os-release"),
           "VOCABLE_APT_DIR": str(tmp_path / "apt")}
    if sudo is None:   # no sudo at all: PATH without the system's
        for tool in ("bash", "grep", "cat", "dpkg", "env"):
            os.symlink(f"/bin/{tool}" if os.path.exists(f"/bin/{tool}") else f"/usr/bin/{tool}", bin_dir / tool)
        env["PATH"] = str(bin_dir)
    proc = subprocess.run(["/bin/bash", str(SCRIPT), purpose], env=env, capture_output=True, text=True, timeout=60)
    return proc, (log.read_text().splitlines() if log.exists() else [])


def test_nothing_missing_does_nothing(tmp_path):
    everything = {"g++", "python3", "python3-venv", "python3-dev", "libsndfile1", "libportaudio2", "libegl1", "libgl1",
                  "libfontconfig1", "libglib2.0-0", "libxkbcommon0", "libdbus-1-3", "fonts-dejavu-core",
                  "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "glslc", "libvulkan-dev", "spirv-headers",
                  "mesa-vulkan-drivers"}
    proc, apt = run(tmp_path, "app", installed=everything, uid=0, sudo=None)
    assert proc.returncode == 0 and apt == [] and proc.stderr == ""


def test_root_installs_exactly_what_is_missing(tmp_path):
    proc, apt = run(tmp_path, "test", installed={"g++", "python3", "libgl1"}, uid=0, sudo=None)
    assert proc.returncode == 0, proc.stderr
    assert len(apt) == 1 and apt[0].startswith("apt-get -o DPkg::Lock::Timeout=600 install -y")
    asked = apt[0].split()
    assert "libportaudio2" in asked and "espeak-ng" in asked and "pulseaudio" in asked
    assert "g++" not in asked and "libgl1" not in asked and "xvfb" not in asked


MESA = "mesa-vulkan-drivers"


def test_debian_12_gets_mesa_25_from_backports_for_the_tests(tmp_path):
    """Its Mesa 22.3 lavapipe corrupts the heap under ggml's Vulkan backend (tests/test_devices.py)."""
    proc, apt = run(tmp_path, "test", installed={"g++", MESA}, uid=0, sudo=None, codename="bookworm",
                    mesa="22.3.6-1+deb12u2")
    assert proc.returncode == 0, proc.stderr
    assert apt[-2:] == ["apt-get -o DPkg::Lock::Timeout=600 update -qq",
                        "apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends -t bookworm-backports "
                        "mesa-vulkan-drivers"], apt
    source = tmp_path / "apt" / "sources.list.d" / "vocable-backports.list"
    assert source.read_text() == "deb http://deb.debian.org/debian bookworm-backports main\n"
    assert "bookworm-backports" in proc.stderr
    # Mesa 25 already there: nothing more; the app alone does not need it
    for purpose, mesa in (("test", "25.0.7-2~bpo12+1"), ("app", "22.3.6-1+deb12u2")):
        folder = tmp_path / purpose
        folder.mkdir()
        proc, apt = run(folder, purpose, installed={"g++", MESA}, uid=0, sudo=None, codename="bookworm", mesa=mesa)
        assert proc.returncode == 0 and not any("backports" in line for line in apt), (purpose, apt)


def test_sudo_without_a_prompt_is_used(tmp_path):
    proc, apt = run(tmp_path, "app", installed=set(), uid=1000, sudo="ok")
    assert proc.returncode == 0, proc.stderr
    assert apt and "libportaudio2" in apt[0]


@pytest.mark.parametrize("sudo", ["asks", None])
def test_without_root_it_names_the_packages_and_goes_on(tmp_path, sudo):
    proc, apt = run(tmp_path, "app", installed={"g++"}, uid=1000, sudo=sudo)
    assert proc.returncode == 0 and apt == []
    assert "missing system packages:" in proc.stderr and "libportaudio2" in proc.stderr
    assert "sudo apt-get install" in proc.stderr and " g++" not in proc.stderr


def test_an_unknown_purpose_is_refused(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "everything"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_a_release_without_glslc_installs_the_rest(tmp_path):
    """Ubuntu 22.04 has no glslc: apt refuses a list that names it, so the rest goes in without the
    Vulkan build tools (the app then runs on the CPU), and the set-up goes on."""
    proc, apt = run(tmp_path, "app", installed={"g++"}, uid=0, sudo=None, refused="glslc")
    assert proc.returncode == 0, proc.stderr
    assert "without the Vulkan build tools" in proc.stderr
    last = apt[-1].split()
    assert "libportaudio2" in last and not {"glslc", "libvulkan-dev", "spirv-headers", "mesa-vulkan-drivers"} & set(last)


def test_unreachable_backports_do_not_stop_the_set_up(tmp_path):
    proc, apt = run(tmp_path, "test", installed={"g++", MESA}, uid=0, sudo=None, codename="bookworm",
                    mesa="22.3.6-1+deb12u2", refused="bookworm-backports")
    assert proc.returncode == 0 and "device tests skip" in proc.stderr, proc.stderr
    # a commented-out backports line is not a source
    folder = tmp_path / "commented"
    folder.mkdir()
    (folder / "apt" / "sources.list.d").mkdir(parents=True)
    (folder / "apt" / "sources.list").write_text("# deb http://deb.debian.org/debian bookworm-backports main\n")
    proc, apt = run(folder, "test", installed={"g++", MESA}, uid=0, sudo=None, codename="bookworm",
                    mesa="22.3.6-1+deb12u2")
    assert (folder / "apt" / "sources.list.d" / "vocable-backports.list").exists(), proc.stderr


def test_the_renamed_glib_counts_as_installed(tmp_path):
    """Ubuntu 24.04 and Debian 13 have libglib2.0-0t64; the old name is only an alias."""
    everything = {"g++", "python3", "python3-venv", "python3-dev", "libsndfile1", "libportaudio2", "libegl1", "libgl1",
                  "libfontconfig1", "libglib2.0-0t64", "libxkbcommon0", "libdbus-1-3", "fonts-dejavu-core",
                  "libxcb-cursor0", "libxcb-icccm4", "libxcb-keysyms1", "glslc", "libvulkan-dev", "spirv-headers",
                  "mesa-vulkan-drivers"}
    proc, apt = run(tmp_path, "app", installed=everything, uid=1000, sudo="asks")
    assert proc.returncode == 0 and apt == [] and proc.stderr == ""
