"""Registers and spills of the persistent T2S step kernel for a GPU target, read on a machine
without a GPU: Triton compiles the kernel to PTX and its bundled ptxas reports what each thread
uses (``ptxas -v``).

    PYTHONPATH=. python scripts/t2s_persistent_registers.py --out docs/results/cpu_36_t2s_registers.json

Why: one program runs on each SM, so a thread may take up to 255 registers; whatever the kernel
keeps live beyond that (the weight tiles each program loads before a grid barrier) goes to local
memory, and each spilled value costs a store and a load on the step's critical path. The rows are
the engine's knobs (engine_persistent.py) at the official v2 shapes (d 512, 16 heads, FFN 2048,
vocabulary 1025, 24 layers), 132 programs, the sweep's 560-position cache: the constexprs come from
the engine itself (``kernel_constants``) and the alignment hints are those a launch gives.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from core.atomic_io import write_text_atomic
from models.gpt_sovits.engine_persistent import PERSISTENT, PersistentT2SEngine, _t2s_step_kernel
from models.gpt_sovits.engine_weights import MANIFEST_PATH, T2SWeights, random_state_dict
from models.gpt_sovits.t2s_checkpoint import t2s_from_manifest

MAX_LEN = 560  # scripts/sweep_t2s_persistent.py's cache: 30 phones + 30 prompt tokens + 500 tokens, rounded to 16
FLOAT32_POINTERS = {"xin_ptr", "part_m_ptr", "part_s_ptr", "part_acc_ptr", "sum1_ptr", "normed1_ptr", "hidden_ptr",
                    "sum2_ptr", "logits_ptr", "q_ptr"}
INT32_POINTERS = {"counter_ptr", "error_ptr", "arrivals_ptr"}
INT64_POINTERS = {"last_token_ptr", "audio_pos_ptr", "cache_len_ptr", "timeline_ptr"}
INTEGERS = {"cache_layer_stride", "phase_layer"}
# name -> the engine's knobs; every row on 132 programs (the default grid) and 8 warps unless named
ROWS = {"four_barriers": {"fold_ffn": False, "fold_out": False}, "fold_ffn": {"fold_out": False},
        "fold_ffn_out (default)": {}, "fold_ffn_out_w16": {"step_warps": 16}, "prefetch_out": {"prefetch_out": True},
        "replicas1": {"sum_replicas": 1}, "late_key_score": {"late_key_score": True},
        "late_key_score_prefetch_out": {"late_key_score": True, "prefetch_out": True},
        "split_out": {"split_out": True}, "arrive_after_loads": {"arrive_first": False},
        "out_not_in_l2": {"out_in_l2": False}, "relaxed_polls": {"relaxed_polls": True},
        "prefetch_l2": {"prefetch_l2": True}, "timeline": {"timeline": True},
        "loads_not_hoisted": {"hoist_loads": False}, "one_pass_norm": {"one_pass_norm": True}}


def signature() -> dict[str, str]:
    """Triton argument types of the kernel's arguments (FP16 weights and cache)."""
    types = {}
    for param in _t2s_step_kernel.params:
        name = param.name
        if param.is_constexpr:
            types[name] = "constexpr"
        elif name == "scale":
            types[name] = "fp32"
        elif name in INTEGERS:
            types[name] = "i32"
        else:
            types[name] = ("*fp32" if name in FLOAT32_POINTERS else "*i32" if name in INT32_POINTERS
                           else "*i64" if name in INT64_POINTERS else "*fp16")
    return types


def aligned_arguments() -> dict:
    """What a launch tells the compiler: every pointer (a fresh torch allocation or a whole stacked
    tensor) and both integers (the cache's layer stride; layer 0 in the persistent kernel) are
    multiples of 16, which lets it vectorize loads."""
    return {(index,): [["tt.divisibility", 16]] for index, param in enumerate(_t2s_step_kernel.params)
            if not param.is_constexpr and param.name != "scale"}


def step_engine(state_dict: dict, config, **knobs) -> PersistentT2SEngine:
    """The engine whose launch the compile reproduces, built on the CPU (``phased``: no GPU here)."""
    weights = T2SWeights.from_state_dict(config, state_dict, torch.float16, "cpu")
    return PersistentT2SEngine(weights, max_batch=1, max_len=MAX_LEN, length_buckets=[MAX_LEN], phased=True, **knobs)


def compile_step(engine: PersistentT2SEngine, capability: int = 90):
    """The persistent kernel as ``engine`` would launch it, compiled for ``capability``."""
    source = ASTSource(_t2s_step_kernel, signature(), engine.kernel_constants(PERSISTENT), aligned_arguments())
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": engine.step_warps})


def bundled_ptxas() -> Path:
    """The ptxas binary shipped inside the Triton wheel (it runs without a GPU)."""
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def ptxas_report(ptx: str, arch: str) -> dict:
    """Registers a thread and spill bytes, by the ptxas that Triton bundles."""
    ptxas = bundled_ptxas()
    with tempfile.TemporaryDirectory() as work:
        source = Path(work) / "step.ptx"
        source.write_text(ptx)
        done = subprocess.run([str(ptxas), "-v", f"-arch={arch}", str(source), "-o", str(Path(work) / "step.cubin")],
                              capture_output=True, text=True, check=True)
    text = done.stdout + done.stderr
    registers = re.search(r"Used (\d+) registers", text)
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    return {"registers": int(registers.group(1)), "spill_store_bytes": int(stores.group(1)) if stores else 0,
            "spill_load_bytes": int(loads.group(1)) if loads else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--capability", type=int, default=90, help="compute capability (90: H100 and H200)")
    args = parser.parse_args()
    arch = f"sm_{args.capability}a" if args.capability >= 90 else f"sm_{args.capability}"
    config = t2s_from_manifest(MANIFEST_PATH).config
    state_dict = random_state_dict(config, seed=0)  # the values do not matter: only the shapes are compiled
    report = {"what": "ptxas -v of the persistent T2S step kernel, FP16, official v2 shapes, as launched",
              "triton": triton.__version__, "arch": arch, "max_len": MAX_LEN, "rows": {}}
    for name, knobs in ROWS.items():
        engine = step_engine(state_dict, config, **knobs)
        row = {"knobs": knobs, "programs": engine.programs, "warps": engine.step_warps,
               **ptxas_report(compile_step(engine, args.capability).asm["ptx"], arch)}
        report["rows"][name] = row
        print(name, row, flush=True)
    write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
