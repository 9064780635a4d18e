"""A second KV tier under the block pool: host memory, optionally kept on disk.

When the pool evicts a cached block (BlockPool.on_evict), its K/V for every layer is
copied out of the KV cache tensor into this tier, keyed by the block's chained hash
(which already names the model and the cache salt, so tenants stay apart). When a
prefix lookup's run of pool hits ends, the run goes on here: those blocks are copied
back into fresh pool blocks instead of being recomputed.

Memory holds at most `memory_bytes` (LRU). With a directory, every offloaded block is
also written there (write-through, so a crash loses nothing), one file per block,
written to a temporary name and renamed; the directory holds at most `disk_bytes` of
this engine's files (LRU by last use). Each file records the model id, dtype, block
size, the block's shape and a checksum of its payload; a file that is foreign (another
model, dtype or layout) is skipped when the directory is scanned, and one whose
checksum fails is skipped when read, both with a warning, never loaded.

KVCacheManager owns the tier and calls it (attach_tier, lookups, prewarm), handing it
the pool and the hashes it needs as arguments; the tier never reads the manager
(tests/test_architecture.py holds this).

On CUDA, blocks are copied to pinned host memory and back; on CPU the pool already
lives in host memory, so the memory tier is a plain copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from inference.block_pool import Block, BlockPool
from inference.metrics import RESTORE_BUCKETS, Histogram

log = logging.getLogger(__name__)

MAGIC = b"PCKV1\n"
SUFFIX = ".kv"
_HEADER_LEN = struct.Struct("<I")


def _payload_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _checksum(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


class DiskStore:
    """One file per block under `root`, bounded by `max_bytes`, least recently used out."""

    def __init__(self, root: str | os.PathLike, max_bytes: int, identity: dict):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        # What every file must declare to be ours: model id, dtype, block size, shape.
        self.identity = identity
        self.index: OrderedDict[bytes, int] = OrderedDict()  # hash -> file size
        self.bytes = 0
        self.skipped = 0
        self._scan()

    def _path(self, block_hash: bytes) -> Path:
        return self.root / (block_hash.hex() + SUFFIX)

    def _scan(self) -> None:
        found = []
        for path in self.root.glob("*" + SUFFIX):
            try:
                block_hash = bytes.fromhex(path.stem)
                st = path.stat()
                header, offset = self._read_header(path)
            except (OSError, ValueError) as exc:
                self._skip(path, f"unreadable ({exc})", scanning=True)
                continue
            problem = self._foreign(header, block_hash)
            size = header.get("payload_bytes")
            if problem is None and (not isinstance(size, int) or st.st_size != offset + size):
                problem = "truncated"
            if problem:
                self._skip(path, problem, scanning=True)
                continue
            found.append((st.st_mtime, block_hash, st.st_size))
        if self.skipped > self.MAX_WARNINGS:
            log.warning("KV tier: skipped %d files in %s in all (another model, dtype or "
                        "layout, or damaged); none was loaded", self.skipped, self.root)
        for _, block_hash, size in sorted(found):
            self.index[block_hash] = size
            self.bytes += size
        self._shrink()

    # A scan names this many skipped files in the log and sums up the rest.
    MAX_WARNINGS = 10

    def _skip(self, path: Path, why: str, scanning: bool = False) -> None:
        self.skipped += 1
        if not scanning or self.skipped <= self.MAX_WARNINGS:
            log.warning("KV tier: skipping %s: %s", path, why)

    @staticmethod
    def _read_header(path: Path) -> tuple[dict, int]:
        with open(path, "rb") as f:
            return DiskStore._parse_header(f.read(1 << 12), f)

    @staticmethod
    def _parse_header(data: bytes, f=None) -> tuple[dict, int]:
        """(header, payload offset) from the file's first bytes (more read from f if needed)."""
        start = len(MAGIC) + _HEADER_LEN.size
        if len(data) < start or data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a KV block file")
        (n,) = _HEADER_LEN.unpack(data[len(MAGIC) : start])
        if n > 1 << 16:
            raise ValueError("header too long")
        if len(data) < start + n and f is not None:
            data += f.read(start + n - len(data))
        header = json.loads(data[start : start + n])
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        return header, start + n

    def _foreign(self, header: dict, block_hash: bytes) -> str | None:
        for key, want in self.identity.items():
            if header.get(key) != want:
                return f"{key} is {header.get(key)!r}, this engine has {want!r}"
        if header.get("hash") != block_hash.hex():
            return "its name does not match the hash it records"
        return None

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.index

    def put(self, block_hash: bytes, data: torch.Tensor) -> list[bytes]:
        """Write a block (or refresh its LRU place); returns the hashes pushed out."""
        if block_hash in self.index:
            self.index.move_to_end(block_hash)
            return []
        payload = _payload_bytes(data)
        header = dict(self.identity, hash=block_hash.hex(), payload_bytes=len(payload),
                      checksum=_checksum(payload))
        head = json.dumps(header, sort_keys=True).encode()
        blob = b"".join((MAGIC, _HEADER_LEN.pack(len(head)), head, payload))
        if len(blob) > self.max_bytes:
            return []
        path = self._path(block_hash)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)  # atomic: readers see the whole file or none
        except OSError as exc:
            log.warning("KV tier: could not write %s: %s", path, exc)
            tmp.unlink(missing_ok=True)
            return []
        self.index[block_hash] = len(blob)
        self.bytes += len(blob)
        return self._shrink()

    def get(self, block_hash: bytes, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """The block's K/V, or None (and the file dropped) if it is gone or corrupt."""
        if block_hash not in self.index:
            return None
        path = self._path(block_hash)
        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)  # writable, for torch
                f.readinto(data)
            header, offset = self._parse_header(data)
            payload = memoryview(data)[offset:]
        except (OSError, ValueError) as exc:
            self._drop(block_hash, unlink=False)
            if not isinstance(exc, FileNotFoundError):  # another engine may have removed it
                self._skip(path, f"unreadable ({exc})")
            return None
        problem = self._foreign(header, block_hash)
        if problem is None and (len(payload) != header.get("payload_bytes")
                                or _checksum(payload) != header.get("checksum")):
            problem = "checksum mismatch"
        if problem:
            self._skip(path, problem)
            self._drop(block_hash, unlink=problem == "checksum mismatch")
            return None
        self.index.move_to_end(block_hash)
        with contextlib.suppress(OSError):
            os.utime(path)  # last use, for the LRU order after a restart
        out = torch.empty(shape, dtype=dtype)
        out.reshape(-1).view(torch.uint8).copy_(torch.frombuffer(payload, dtype=torch.uint8))
        return out

    def _drop(self, block_hash: bytes, unlink: bool = True) -> None:
        size = self.index.pop(block_hash, None)
        if size is None:
            return
        self.bytes -= size
        if unlink:
            with contextlib.suppress(OSError):
                self._path(block_hash).unlink()

    def _shrink(self) -> list[bytes]:
        dropped = []
        while self.bytes > self.max_bytes and self.index:
            block_hash = next(iter(self.index))
            self._drop(block_hash)
            dropped.append(block_hash)
        return dropped

    def clear(self) -> None:
        for block_hash in list(self.index):
            self._drop(block_hash)


class KVTier:
    """Blocks' K/V by hash: an LRU in host memory over an optional disk store."""

    def __init__(
        self,
        kv_cache: torch.Tensor,
        memory_bytes: int,
        kv_dir: str | os.PathLike | None = None,
        disk_bytes: int = 0,
        model_id: str = "",
    ):
        self.kv_cache = kv_cache  # [2, layers, blocks, block_size, kv_heads, head_dim]
        self.block_shape = (kv_cache.shape[0], kv_cache.shape[1], *kv_cache.shape[3:])
        self.dtype = kv_cache.dtype
        self.block_bytes = kv_cache[:, :, 0].numel() * kv_cache.element_size()
        self.memory_bytes = memory_bytes
        self.pin = kv_cache.device.type == "cuda"
        self.memory: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self.disk: DiskStore | None = None
        if kv_dir is not None:
            self.disk = DiskStore(kv_dir, disk_bytes, {
                "model_id": model_id,
                "dtype": str(self.dtype).removeprefix("torch."),
                "block_size": int(kv_cache.shape[3]),
                "shape": list(self.block_shape),
            })
        # Told each hash the tier lets go of (memory and disk), so a miss can say it was
        # evicted here too; set by KVCacheManager.attach_tier.
        self.on_drop: Callable[[bytes], None] | None = None
        self.offloads = 0  # blocks copied out of the pool
        self.restores = 0  # blocks copied back into the pool
        self.restore_seconds = Histogram(RESTORE_BUCKETS)  # per restored run, reads included

    # --- what it holds -------------------------------------------------------
    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.memory or (self.disk is not None and block_hash in self.disk)

    @property
    def capacity_blocks(self) -> int:
        """How many blocks memory and disk hold together, at most."""
        capacity = self.memory_bytes // self.block_bytes
        if self.disk is not None:
            capacity += self.disk.max_bytes // self.block_bytes
        return capacity

    def persisted_hashes(self) -> Iterator[bytes]:
        """The hashes on disk, oldest use first: blocks computed before a restart."""
        return iter(self.disk.index) if self.disk is not None else iter(())

    @property
    def memory_used_bytes(self) -> int:
        return len(self.memory) * self.block_bytes

    def stats(self) -> dict:
        disk = self.disk
        return {
            "kv_tier_memory_blocks": len(self.memory),
            "kv_tier_memory_bytes": self.memory_used_bytes,
            "kv_tier_memory_capacity_bytes": self.memory_bytes,
            "kv_tier_disk_blocks": len(disk.index) if disk else 0,
            "kv_tier_disk_bytes": disk.bytes if disk else 0,
            "kv_tier_disk_capacity_bytes": disk.max_bytes if disk else 0,
            "kv_tier_disk_files_skipped": disk.skipped if disk else 0,
            "kv_tier_offloads": self.offloads,
            "kv_tier_restores": self.restores,
            "kv_tier_restore_seconds": self.restore_seconds.snapshot(),
        }

    # --- in and out ----------------------------------------------------------
    def offload(self, block: Block) -> None:
        """BlockPool.on_evict: keep the evicted block's K/V (still in the cache tensor)."""
        h = block.block_hash
        if h is None:
            return
        if h in self.memory:
            self.memory.move_to_end(h)
            if self.disk is not None:
                self.disk.put(h, self.memory[h])  # refreshes its LRU place
            return
        if self.disk is not None and h in self.disk and self.memory_bytes < self.block_bytes:
            self.disk.index.move_to_end(h)
            return
        src = self.kv_cache[:, :, block.block_id]
        if self.pin:
            data = torch.empty(self.block_shape, dtype=self.dtype, pin_memory=True)
            data.copy_(src)  # synchronous: the block is overwritten by the next step
        else:
            data = src.clone()
        self.offloads += 1
        self._keep(h, data)

    def _keep(self, h: bytes, data: torch.Tensor) -> None:
        if self.disk is not None:
            for gone in self.disk.put(h, data):
                if gone not in self.memory:
                    self._dropped(gone)
        if self.memory_bytes >= self.block_bytes:
            self.memory[h] = data
            while len(self.memory) * self.block_bytes > self.memory_bytes:
                gone, _ = self.memory.popitem(last=False)
                if self.disk is None or gone not in self.disk:
                    self._dropped(gone)
        elif self.disk is None or h not in self.disk:
            self._dropped(h)

    def _dropped(self, h: bytes) -> None:
        if self.on_drop is not None:
            self.on_drop(h)

    def fetch(self, h: bytes) -> torch.Tensor | None:
        data = self.memory.get(h)
        if data is not None:
            self.memory.move_to_end(h)
            return data
        if self.disk is None:
            return None
        data = self.disk.get(h, self.block_shape, self.dtype)
        if data is not None and self.memory_bytes >= self.block_bytes:
            if self.pin:
                data = data.pin_memory()
            self._keep(h, data)
        return data

    def restore(
        self, pool: BlockPool, hashes: Sequence[bytes], token_ids: Sequence[int], start: int,
        protect: Sequence[Block], max_blocks: int,
    ) -> list[Block]:
        """Copy the tier's run of `hashes` back into fresh pool blocks, registered as cached
        and left free (ref 0) in the pool; returns them, in chain order.

        `start` is the chain index of hashes[0]; `protect` are blocks the caller found in
        the pool and must not lose to the allocation (they are pinned meanwhile). At most
        max_blocks, and never more than the pool's free blocks that are not protected.
        """
        began = time.perf_counter()
        free_protected = sum(1 for b in protect if b.ref_cnt == 0)
        room = min(max_blocks, pool.num_free_blocks - free_protected)
        wanted: list[tuple[bytes, torch.Tensor]] = []
        for h in hashes[: max(room, 0)]:
            if h not in self:
                break
            data = self.fetch(h)  # before allocating: eviction below may push it out
            if data is None:
                break
            wanted.append((h, data))
        if not wanted:
            return []
        pool.touch(protect)
        blocks = pool.allocate(len(wanted))
        bs = self.kv_cache.shape[3]
        for i, (b, (h, data)) in enumerate(zip(blocks, wanted, strict=True)):
            # One copy per block straight into its slot (pinned host -> device on CUDA).
            self.kv_cache[:, :, b.block_id].copy_(data, non_blocking=self.pin)
            j = start + i
            pool.cache_block(b, h, token_ids[j * bs : (j + 1) * bs])
            b.from_tier = True
        # Back to the free queue as cached blocks, deepest first (evicted first).
        pool.free(reversed(blocks))
        pool.free(protect)
        self.restores += len(blocks)
        self.restore_seconds.observe(time.perf_counter() - began)
        return blocks

    def persist(self, pool: BlockPool, max_blocks: int | None = None) -> int:
        """Write the pool's cached blocks that the disk lacks to disk, while it has room
        (never pushing older files out); returns how many were written. Evictions write
        their blocks already; this saves the ones still in the pool (at shutdown, or a
        few at a time while the engine idles)."""
        disk = self.disk
        if disk is None:
            return 0
        written = 0
        for h, holders in list(pool.cached.items()):
            if max_blocks is not None and written >= max_blocks:
                break
            if h in disk:
                continue
            if disk.bytes + self.block_bytes + 4096 > disk.max_bytes:
                break
            block = next(iter(holders.values()))
            disk.put(h, self.kv_cache[:, :, block.block_id].cpu())
            written += 1
        return written

    def clear(self) -> None:
        self.memory.clear()
        if self.disk is not None:
            self.disk.clear()


def build_tier(config, kv_cache: torch.Tensor, model_id: str) -> KVTier | None:
    """The tier an EngineConfig asks for (kv_offload_bytes, kv_dir), or None."""
    if not config.enable_prefix_caching or (config.kv_offload_bytes <= 0 and not config.kv_dir):
        return None
    return KVTier(kv_cache, config.kv_offload_bytes, config.kv_dir, config.kv_dir_bytes, model_id)
