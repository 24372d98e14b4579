"""The NVIDIA GPU source: where no device node exists the library is never looked for (a
daemon start on a GPU-less host spawns nothing and loads nothing)."""

from temperd.sources import nvml


def test_without_a_device_node_the_library_is_not_loaded(monkeypatch):
    loaded = []
    monkeypatch.setattr(nvml.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda name: loaded.append(name))
    assert nvml.gpu_state() == (False, "no NVIDIA GPU or NVML library on this host")
    assert loaded == []


def test_a_device_node_without_the_library_is_no_gpu(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(nvml.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    monkeypatch.setattr(nvml.ctypes, "CDLL", missing)
    assert nvml.gpu_state()[0] is False

