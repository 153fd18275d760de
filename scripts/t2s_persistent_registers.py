"""Registers and spills of the persistent T2S step kernel for a GPU target, read on a machine
without a GPU: Triton compiles the kernel to PTX and its bundled ptxas reports what each thread
uses (``ptxas -v``).

    PYTHONPATH=. python scripts/t2s_persistent_registers.py --out docs/results/cpu_34_t2s_registers.json

Why: one program runs on each SM, so a thread may take up to 255 registers; whatever the kernel
keeps live beyond that (the weight tiles each program loads before a grid barrier) goes to local
memory, and each spilled value costs a store and a load on the step's critical path. The rows are
the engine's knobs (engine_persistent.py) at the official v2 shapes (d 512, 16 heads, FFN 2048,
vocabulary 1025, 24 layers), 132 programs, a 576-position cache.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from core.atomic_io import write_text_atomic
from models.gpt_sovits.engine_persistent import DEFAULT_PROGRAMS, PERSISTENT, _t2s_step_kernel

D, HEADS, HEAD_DIM, FFN, VOCAB, LAYERS, MAX_LEN, MAX_POSITION = 512, 16, 32, 2048, 1025, 24, 576, 4000
INT64_POINTERS = {"last_token_ptr", "audio_pos_ptr", "cache_len_ptr"}
INT32_POINTERS = {"counter_ptr", "error_ptr", "arrivals_ptr"}
FLOAT32_POINTERS = {"xin_ptr", "part_m_ptr", "part_s_ptr", "part_acc_ptr", "sum1_ptr", "normed1_ptr", "hidden_ptr",
                    "sum2_ptr", "logits_ptr", "q_ptr"}
# (name, fold_ffn, fold_out, prefetch_out, sum_replicas, late_key_score, warps)
ROWS = [("four_barriers", False, False, False, 1, False, 8), ("fold_ffn", True, False, False, 1, False, 8),
        ("fold_ffn_out (default)", True, True, False, 1, False, 8),
        ("fold_ffn_out_w16", True, True, False, 1, False, 16),
        ("prefetch_out", True, True, True, 1, False, 8), ("replicas8", True, True, False, 8, False, 8),
        ("late_key_score", True, True, False, 1, True, 8), ("late_key_score_prefetch_out", True, True, True, 1, True, 8),
        ("late_key_score_replicas8", True, True, False, 8, True, 8)]


def signature() -> dict[str, str]:
    """Triton argument types of the kernel's runtime arguments (FP16 weights and cache)."""
    types = {}
    for param in _t2s_step_kernel.params:
        name = param.name
        if param.is_constexpr:
            types[name] = "constexpr"
        elif name == "scale":
            types[name] = "fp32"
        elif name in ("cache_layer_stride", "phase_layer"):
            types[name] = "i32"
        elif name in INT64_POINTERS:
            types[name] = "*i64"
        elif name in INT32_POINTERS:
            types[name] = "*i32"
        elif name in FLOAT32_POINTERS:
            types[name] = "*fp32"
        else:
            types[name] = "*fp16"
    return types


def constants(fold_ffn: bool, fold_out: bool, prefetch_out: bool, replicas: int, late: bool) -> dict:
    """The constexprs ``PersistentT2SEngine._launch`` passes for these knobs."""
    chunks = DEFAULT_PROGRAMS // HEADS - 2
    chunk_max = triton.cdiv(MAX_LEN, chunks)

    def tile(columns: int) -> int:
        return triton.next_power_of_2(triton.cdiv(columns, DEFAULT_PROGRAMS))

    sum1_replicas, sum2_replicas = (replicas if fold_out else 1), (replicas if fold_ffn else 1)
    return dict(D=D, D_PAD=D, H=HEADS, H_PAD=HEADS, HD=HEAD_DIM, HD_PAD=HEAD_DIM, FFN=FFN, FFN_PAD=FFN, VOCAB=VOCAB,
                LAYERS=LAYERS, PROGRAMS=DEFAULT_PROGRAMS, CHUNKS=chunks, PARTS_PAD=triton.next_power_of_2(chunks + 1),
                CHUNK_MAX=chunk_max, BLOCK_L=min(128, triton.next_power_of_2(chunk_max)), MAX_LEN=MAX_LEN,
                MAX_POSITION=MAX_POSITION, BN_OUT=tile(D), BN_FFN1=tile(FFN), BN_FFN2=tile(D), BN_VOCAB=tile(VOCAB),
                FOLD_FFN=fold_ffn, PHASES=4 - fold_ffn - fold_out, SUM2_STRIDE=sum2_replicas * D if fold_ffn else 0,
                EPS=1e-5, PHASE=PERSISTENT, ASM_BARRIER=True, FOLD_OUT=fold_out,
                SUM1_STRIDE=sum1_replicas * D if fold_out else 0, PREFETCH_OUT=prefetch_out,
                SUM1_REPLICAS=sum1_replicas, SUM2_REPLICAS=sum2_replicas, LATE_KEY_SCORE=late)


def ptxas_report(ptx: str, arch: str) -> dict:
    """Registers a thread and spill bytes, by the ptxas that Triton bundles."""
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
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
    report = {"what": "ptxas -v of the persistent T2S step kernel, FP16, official v2 shapes, 132 programs",
              "triton": triton.__version__, "arch": arch, "rows": {}}
    for name, fold_ffn, fold_out, prefetch_out, replicas, late, warps in ROWS:
        source = ASTSource(_t2s_step_kernel, signature(), constants(fold_ffn, fold_out, prefetch_out, replicas, late))
        kernel = triton.compile(source, target=GPUTarget("cuda", args.capability, 32), options={"num_warps": warps})
        row = {"fold_ffn": fold_ffn, "fold_out": fold_out, "prefetch_out": prefetch_out, "sum_replicas": replicas,
               "late_key_score": late, "warps": warps, **ptxas_report(kernel.asm["ptx"], arch)}
        report["rows"][name] = row
        print(name, row, flush=True)
    write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
