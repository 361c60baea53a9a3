"""Keep freed host memory in the process, so that a decode step's temporaries do not fault in fresh pages.

glibc's malloc maps large blocks afresh and unmaps them on free, and hands the free top of its heap back to
the kernel. A decode step at batch 16-64 allocates several such blocks (logits and probabilities over the
vocabulary, a float64 CDF: megabytes each) and frees them again, so every step touches new 4 KB pages, and the
kernel zeroes each on first touch, which costs several times the arithmetic on them.
torch's GPU allocator caches blocks for the same reason; its CPU allocator leaves this to malloc, so the process
that runs the engine (the CLI, an RL rollout worker) tunes malloc once at start.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # blocks up to here come from the heap and are reused
TRIM_THRESHOLD = 1 << 30  # free heap kept before any is handed back


def retain_freed_memory() -> bool:
    """Make malloc keep freed blocks up to 32 MB for reuse (and up to 1 GB of free heap) instead of returning
    them to the kernel. True where it took effect (glibc); elsewhere a no-op that returns False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)  # musl has a stub that returns 0
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
