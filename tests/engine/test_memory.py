import ctypes
import ctypes.util
import sys

from bebop.engine import memory


def glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "gnu_get_libc_version")
    except OSError:
        return False


def test_retain_freed_memory_takes_effect_on_glibc():
    assert memory.retain_freed_memory() is (sys.platform.startswith("linux") and glibc())


def test_elsewhere_it_is_a_no_op(monkeypatch):
    monkeypatch.setattr(memory.sys, "platform", "darwin")
    assert memory.retain_freed_memory() is False
