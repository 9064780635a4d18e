"""bench memory's reading of /proc/<pid>/smaps."""

from bench.memory import resident_by_kind

SMAPS = """\
55d0c0000000-55d0c0100000 r-xp 00000000 fe:00 1 /usr/lib/x86_64-linux-gnu/libtorch_cpu.so
Size:               1024 kB
Rss:                1024 kB
55d0c0100000-55d0c0200000 r--p 00000000 fe:00 2 /usr/lib/libc.so.6
Rss:                 512 kB
7f0000000000-7f0040000000 rw-p 00000000 00:00 0
Size:            1048576 kB
Rss:              307200 kB
7f0040000000-7f0041000000 rw-p 00000000 00:00 0 [heap]
Rss:               10240 kB
7f0050000000-7f0055c00000 r--p 00000000 fe:00 3 /cache/smollm2.int4.safetensors
Rss:               94208 kB
"""


def test_resident_memory_is_split_by_what_the_mappings_hold():
    kinds = resident_by_kind(SMAPS)
    assert kinds == {"libraries": 1.5, "files": 92.0, "anonymous": 310.0,
                     "largest_anonymous": 300.0}
