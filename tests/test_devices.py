"""The devices the engine finds (native/src/backend-loader.cpp, qt_device_count/qt_get_device/
qt_device_notes): the CPU always, first; the devices of ggml's Vulkan backend where the engine
was built with it and a Vulkan driver is installed (CI: Mesa's software driver, lavapipe, which
ggml lists only when GGML_VK_VISIBLE_DEVICES selects it); and where the Vulkan loader cannot be
loaded, a note that says why and the CPU as before. Each check runs in a process of its own:
the backends load once per process, after the environment is read."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import vocable._engine as _engine

VULKAN_MODULE = Path(_engine.__file__).parent / "lib" / "libggml-vulkan.so"
LIST_DEVICES = ("import json; from vocable import _engine; "
                "print(json.dumps({'devices': _engine.devices(), 'notes': _engine.device_notes()}))")


def found(env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", LIST_DEVICES], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def needs_vulkan_module():
    if not VULKAN_MODULE.is_file():
        pytest.skip(f"the engine was built without ggml's Vulkan backend (no {VULKAN_MODULE.name}: "
                    "VOCABLE_VULKAN needs glslc, libvulkan-dev and spirv-headers)")


def test_the_cpu_is_always_there_and_first():
    devices = _engine.devices()
    cpu = devices[0]
    assert cpu["id"] == "cpu" and cpu["kind"] == "cpu" and cpu["description"]
    assert cpu["memory_total"] > 0 and 0 < cpu["memory_free"] <= cpu["memory_total"]
    assert [d["id"] for d in devices].count("cpu") == 1
    assert all(d["id"].split(":")[0] in ("vulkan", "cuda", "metal") for d in devices[1:])


def test_lavapipe_is_found_through_the_vulkan_backend():
    needs_vulkan_module()
    drivers = glob.glob("/usr/share/vulkan/icd.d/lvp_icd*.json")
    if not drivers:
        pytest.skip("Mesa's software Vulkan driver is not installed (mesa-vulkan-drivers)")
    out = found({"GGML_VK_VISIBLE_DEVICES": "0"})
    vulkan = [d for d in out["devices"] if d["id"].startswith("vulkan:")]
    assert out["devices"][0]["id"] == "cpu"
    assert vulkan and vulkan[0]["id"] == "vulkan:0", out
    assert "llvmpipe" in " ".join(d["description"] for d in vulkan) and vulkan[0]["memory_total"] > 0, out


def test_a_machine_without_a_vulkan_loader_gets_the_cpu_and_the_reason(tmp_path):
    """An unloadable libvulkan.so.1 first on the library path stands in for a machine without one."""
    needs_vulkan_module()
    (tmp_path / "libvulkan.so.1").write_bytes(b"")
    library_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("LD_LIBRARY_PATH")]))
    out = found({"LD_LIBRARY_PATH": library_path, "GGML_VK_VISIBLE_DEVICES": "0"})
    assert [d["id"] for d in out["devices"]] == ["cpu"], out
    assert "libggml-vulkan.so: " in out["notes"] and "libvulkan.so.1" in out["notes"], out


def test_about_lists_the_devices():
    proc = subprocess.run([sys.executable, "-m", "vocable", "about"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Devices found: "))
    assert line.startswith("Devices found: cpu (")
