"""Speaker embeddings of uploaded reference clips, computed once and kept by content hash.

    cache = make_speaker_cache(max_entries=1024, ttl_s=86400, redis_url=None)
    key = content_key(clip_bytes)               # sha256 of the uploaded bytes
    embedding = cache.get(key)                  # (D,) float32 or None
    cache.put(key, embedding)

``MemorySpeakerCache``: least-recently-used with a time to live and an entry cap, per process.
``RedisSpeakerCache``: the same contract in Redis, shared by several workers: each entry is a
key with the TTL set by Redis, and a sorted set of last-use times evicts the least recently
used entries past the cap. ``hits`` and ``misses`` count lookups in this process.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from typing import Callable, Protocol

import numpy as np


def content_key(data: bytes) -> str:
    """The cache key of an upload: sha256 of its bytes (the same clip re-uploaded is a hit)."""
    return hashlib.sha256(data).hexdigest()


class SpeakerCache(Protocol):
    hits: int
    misses: int

    def get(self, key: str) -> np.ndarray | None: ...

    def put(self, key: str, embedding: np.ndarray) -> None: ...

    def __len__(self) -> int: ...


class MemorySpeakerCache:
    def __init__(self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError(f"max_entries must be >= 1 and ttl_s > 0, got {max_entries}, {ttl_s}")
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, np.ndarray]] = OrderedDict()  # key -> (expiry, embedding)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] <= self._clock():
                self._entries.pop(key, None)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[1].copy()

    def put(self, key: str, embedding: np.ndarray) -> None:
        with self._lock:
            self._entries[key] = (self._clock() + self.ttl_s, np.asarray(embedding, np.float32).copy())
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            now = self._clock()
            return sum(1 for expiry, _ in self._entries.values() if expiry > now)


class RedisSpeakerCache:
    """``client``: a redis-py client (or fakeredis). Keys live under ``prefix``."""

    def __init__(self, client, max_entries: int, ttl_s: float, prefix: str = "tts:speaker:"):
        if max_entries < 1 or ttl_s <= 0:
            raise ValueError(f"max_entries must be >= 1 and ttl_s > 0, got {max_entries}, {ttl_s}")
        self._redis = client
        self.max_entries = max_entries
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self._prefix = prefix
        self._recency = f"{prefix}recency"  # sorted set: key -> last use (unix seconds)
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        raw = self._redis.get(self._prefix + key)
        if raw is None:
            self._redis.zrem(self._recency, key)
            self.misses += 1
            return None
        self._redis.zadd(self._recency, {key: time.time()})
        self.hits += 1
        return np.frombuffer(raw, dtype=np.float32).copy()

    def put(self, key: str, embedding: np.ndarray) -> None:
        pipe = self._redis.pipeline()
        pipe.set(self._prefix + key, np.asarray(embedding, np.float32).tobytes(), px=self.ttl_ms)
        pipe.zadd(self._recency, {key: time.time()})
        pipe.execute()
        excess = self._redis.zcard(self._recency) - self.max_entries
        if excess > 0:
            oldest = [k.decode() if isinstance(k, bytes) else k for k in self._redis.zrange(self._recency, 0, excess - 1)]
            pipe = self._redis.pipeline()
            pipe.delete(*[self._prefix + k for k in oldest])
            pipe.zrem(self._recency, *oldest)
            pipe.execute()

    def __len__(self) -> int:
        keys = [k.decode() if isinstance(k, bytes) else k for k in self._redis.zrange(self._recency, 0, -1)]
        return sum(1 for key in keys if self._redis.exists(self._prefix + key))


def make_speaker_cache(max_entries: int, ttl_s: float, redis_url: str | None) -> SpeakerCache:
    if redis_url is None:
        return MemorySpeakerCache(max_entries, ttl_s)
    import redis

    return RedisSpeakerCache(redis.Redis.from_url(redis_url), max_entries, ttl_s)
