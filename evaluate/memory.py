"""Memory and size of a variant: CPU peak RSS, CUDA peak allocated, parameters, bytes on disk."""
from __future__ import annotations

import threading
from pathlib import Path

import psutil
import torch
from safetensors.torch import save as safetensors_bytes

MIB = 1024 * 1024


class PeakRssSampler:
    """Peak resident set size of this process while the block runs, sampled every ``interval_s``.

    RSS is process-wide: the peak includes whatever was already resident (libraries, the other
    variants' weights), so compare variants measured in the same process order.
    """

    def __init__(self, interval_s: float = 0.005):
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._process = psutil.Process()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakRssSampler":
        self.peak_bytes = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_bytes = max(self.peak_bytes, self._process.memory_info().rss)

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / MIB


def reset_cuda_peak() -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def cuda_peak_mib() -> float:
    """Peak bytes held by PyTorch's allocator since the last ``reset_cuda_peak``."""
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / MIB


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def state_dict_size_mb(module: torch.nn.Module) -> float:
    """Bytes the weights take serialised as safetensors (what a variant ships), in MB (1e6). A tensor
    shared under several names (tied BERT embeddings and output layer) ships and counts once."""
    tensors, seen = {}, set()
    for name, value in module.state_dict().items():
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if key not in seen:
            seen.add(key)
            tensors[name] = value.detach().cpu().contiguous()
    return len(safetensors_bytes(tensors)) / 1e6


def file_size_mb(path: str | Path) -> float:
    return Path(path).stat().st_size / 1e6
