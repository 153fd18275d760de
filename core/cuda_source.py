"""CUDA C++ compiled at run time (NVRTC) and launched through the driver API, with ctypes only.

Some kernels need what Triton does not expose (thread-block clusters, distributed shared memory,
``cp.async`` into shared memory). The GPU machines have no ``nvcc`` and no CUDA Python bindings, but
PyTorch's CUDA wheels bring NVRTC (``nvidia/*/lib/libnvrtc.so*``) and the driver (``libcuda.so.1``):
that is enough to compile a source string to a cubin and launch it on PyTorch's current stream, so
the launch is captured like any other into a CUDA graph.

    program = compile_cuda(source, "sm_90", defines={"D": 512})      # NVRTC: runs on a CPU too
    kernel = load_kernel(program.cubin, "step", device=0, shared_bytes=100_000)
    kernel.launch(grid=128, block=256, args=[Pointer(tensor), Int64(7)], stream=torch.cuda.current_stream())

``compile_cuda`` needs no GPU: the tests compile the real kernels on a CPU machine.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass
from pathlib import Path

NVRTC_SUCCESS = 0
CUDA_SUCCESS = 0
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
CU_FUNC_ATTRIBUTE_NUM_REGS = 4


class CudaSourceError(RuntimeError):
    """NVRTC or the driver refused: the message carries NVRTC's log or the driver's error name."""


def _library_candidates(stem: str) -> list[str]:
    """Paths of ``lib<stem>.so*`` in the pip ``nvidia`` packages on sys.path (newest name first)."""
    found = []
    for root in sys.path:
        for pattern in (f"nvidia/*/lib/lib{stem}.so*", f"nvidia/cuda_{stem}/lib/lib{stem}.so*"):
            found.extend(glob.glob(os.path.join(root, pattern)))
    return sorted(set(found), reverse=True)


_NVRTC: ctypes.CDLL | None = None


def nvrtc_library() -> ctypes.CDLL:
    """NVRTC, from the ``nvidia`` pip packages (PyTorch's CUDA wheels depend on one) or the system.
    Its builtins library is loaded first, globally: NVRTC opens it by name at compile time."""
    global _NVRTC
    if _NVRTC is not None:
        return _NVRTC
    candidates = [path for path in _library_candidates("nvrtc") if "builtins" not in Path(path).name]
    for path in candidates:
        for builtins in sorted(glob.glob(str(Path(path).parent / "libnvrtc-builtins.so*")), reverse=True):
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            break
        try:
            _NVRTC = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            return _NVRTC
        except OSError:
            continue
    try:
        _NVRTC = ctypes.CDLL("libnvrtc.so", mode=ctypes.RTLD_GLOBAL)
    except OSError as error:
        raise CudaSourceError("NVRTC not found: install the nvidia-cuda-nvrtc wheel (PyTorch's CUDA wheels "
                              "bring one)") from error
    return _NVRTC


def nvrtc_available() -> bool:
    try:
        nvrtc_library()
    except CudaSourceError:
        return False
    return True


@dataclass(frozen=True)
class CompiledCuda:
    """One compiled source: the cubin for ``arch`` and the PTX it came from."""
    cubin: bytes
    ptx: str
    arch: str
    log: str


def compile_cuda(source: str, arch: str, defines: dict[str, object] | None = None, name: str = "kernel.cu",
                 options: tuple[str, ...] = ()) -> CompiledCuda:
    """Compile ``source`` for ``arch`` (such as ``sm_90``) with ``-D`` for each of ``defines``."""
    nvrtc = nvrtc_library()
    nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
    program = ctypes.c_void_p()

    def check(status: int, what: str) -> None:
        if status != NVRTC_SUCCESS:
            raise CudaSourceError(f"{what}: {nvrtc.nvrtcGetErrorString(status).decode()}")

    check(nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None),
          "nvrtcCreateProgram")
    flags = [f"--gpu-architecture={arch}", "--std=c++17", *options]
    flags += [f"-D{key}={value}" for key, value in (defines or {}).items()]
    encoded = [flag.encode() for flag in flags]
    try:
        status = nvrtc.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        log_size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(log_size)), "nvrtcGetProgramLogSize")
        log = ctypes.create_string_buffer(log_size.value)
        check(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
        log_text = log.value.decode(errors="replace")
        if status != NVRTC_SUCCESS:
            raise CudaSourceError(f"{name} did not compile for {arch}:\n{log_text}")
        ptx_size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetPTXSize(program, ctypes.byref(ptx_size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(ptx_size.value)
        check(nvrtc.nvrtcGetPTX(program, ptx), "nvrtcGetPTX")
        cubin_size = ctypes.c_size_t()
        check(nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(cubin_size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(cubin_size.value)
        check(nvrtc.nvrtcGetCUBIN(program, cubin), "nvrtcGetCUBIN")
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return CompiledCuda(cubin.raw, ptx.value.decode(), arch, log_text)


# ---- the driver: loading and launching ---------------------------------------------------------------

_DRIVER: ctypes.CDLL | None = None


def _driver() -> ctypes.CDLL:
    global _DRIVER
    if _DRIVER is None:
        try:
            _DRIVER = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise CudaSourceError("libcuda.so.1 not found: launching needs an NVIDIA driver") from error
        if _DRIVER.cuInit(0) != CUDA_SUCCESS:
            raise CudaSourceError("cuInit failed")
    return _DRIVER


def _check_driver(status: int, what: str) -> None:
    if status != CUDA_SUCCESS:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(status, ctypes.byref(name))
        raise CudaSourceError(f"{what}: {name.value.decode() if name.value else status}")


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, with no attributes: the kernel's compile-time cluster shape applies."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("num_attrs", ctypes.c_uint)]


def Pointer(tensor) -> ctypes.c_void_p:  # noqa: N802 - reads as the argument's C type at a launch
    """A tensor's device address as a kernel argument."""
    return ctypes.c_void_p(tensor.data_ptr())


Int64, Float32 = ctypes.c_int64, ctypes.c_float


class LoadedKernel:
    """One ``__global__`` function of a cubin loaded into the device's primary context (PyTorch's)."""

    def __init__(self, cubin: bytes, name: str, device: int, shared_bytes: int):
        driver = _driver()
        handle = ctypes.c_int()
        _check_driver(driver.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
        context = ctypes.c_void_p()
        _check_driver(driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle), "cuDevicePrimaryCtxRetain")
        _check_driver(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        self._module = ctypes.c_void_p()
        _check_driver(driver.cuModuleLoadData(ctypes.byref(self._module), cubin), "cuModuleLoadData")
        self._function = ctypes.c_void_p()
        _check_driver(driver.cuModuleGetFunction(ctypes.byref(self._function), self._module, name.encode()),
                      f"cuModuleGetFunction({name})")
        _check_driver(driver.cuFuncSetAttribute(self._function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                shared_bytes), "cuFuncSetAttribute(max dynamic shared memory)")
        registers = ctypes.c_int()
        _check_driver(driver.cuFuncGetAttribute(ctypes.byref(registers), CU_FUNC_ATTRIBUTE_NUM_REGS, self._function),
                      "cuFuncGetAttribute(registers)")
        self.registers = registers.value
        self.shared_bytes = shared_bytes
        self.name = name

    def max_active_clusters(self, grid: int, block: int) -> int:
        """How many of the kernel's clusters can be resident at once with this block and shared memory."""
        config = _LaunchConfig((grid, 1, 1), (block, 1, 1), self.shared_bytes, None, None, 0)
        count = ctypes.c_int()
        _check_driver(_driver().cuOccupancyMaxActiveClusters(ctypes.byref(count), self._function,
                                                             ctypes.byref(config)), "cuOccupancyMaxActiveClusters")
        return count.value

    def launch(self, grid: int, block: int, args: list, stream) -> None:
        """Launch on ``stream`` (a torch.cuda.Stream); ``args`` are ctypes values in the kernel's order."""
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(arg), ctypes.c_void_p) for arg in args])
        _check_driver(_driver().cuLaunchKernel(self._function, grid, 1, 1, block, 1, 1, self.shared_bytes,
                                               ctypes.c_void_p(stream.cuda_stream), params, None),
                      f"cuLaunchKernel({self.name})")
