"""How many GPU kernels a profiled region launched: a step bound by the host is bound by this count.

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    launches = kernel_launches(prof)
"""
from __future__ import annotations

from torch.profiler import profile

# The runtime and driver calls that launch a kernel, as the profiler names them.
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"})


def kernel_launches(prof: profile) -> int:
    return sum(1 for event in prof.events() if event.name in LAUNCH_CALLS)
