"""Do cuDNN's fused convolution epilogues pay for EmotiVoice's HiFi-GAN stages? A GPU A/B per stage.

    pip install --target /tmp/site nvidia_cudnn_frontend-1.16.0-cp312-*.whl   # the GPU machine
    PYTHONPATH=/tmp/site:. python3 scripts/bench_cudnn_fused_resblocks.py --out $OUT/fused.json

Why: the vocoder is most of a served batch's time, and the roofline
(scripts/emotivoice_vocoder_roofline.py) puts stages 1-3 near or past the memory ridge. The engine's
compiled vocoder runs each convolution in cuDNN and then one elementwise kernel (bias, LeakyReLU,
padding mask, residual add), so every tensor crosses memory once more between two convolutions.
cuDNN's graph API can run the convolution with that elementwise tail inside its own epilogue.

One stage's multi-receptive-field block (three ResBlock1 of three dilations each, their mean, and
the LeakyReLU and mask the next upsampling takes) over full-size random weights, ``--rows`` rows of
about ``--frames`` frames with a padding mask, FP16, channels-last (N, C, 1, T), each arm captured
in one CUDA graph:

* ``compiled``: the block as the engine runs it, through ``torch.compile`` (cuDNN convolutions,
  Inductor's fused elementwise kernels between them);
* ``cudnn_fused``: one cuDNN graph per convolution with its tail in the epilogue. Only the
  activated tensor a = mask * lrelu(x) is stored: LeakyReLU of slope 0.1 is invertible
  (x = lrelu(a, slope 10) where the mask is 1), so the residual a convolution adds is read back
  from the previous activation, and the residual stream x itself never goes to memory:
  ``t = mask * lrelu(conv1(a) + b1)``; ``a' = mask * lrelu(conv2(t) + b2 + lrelu_10(a))``.
  The engine's operator for the same graphs is models/cudnn_epilogue.py; this script builds its own
  because it also builds the residual forms that were tried (``--residual-form``) and times the
  plans of every graph at its own shape.

Reports each arm's median replay time (the cuDNN arm with each graph's fastest plan, and with the
plan cuDNN's heuristics rank first), their ratio, the largest difference of the outputs against the
compiled arm's peak, and each graph kind checked against PyTorch. A graph cuDNN cannot run is
reported, not fatal. On an H100 (docs/benchmarks.md, session 47): timed plans 1.30x / 1.19x / 1.06x /
1.06x on stages 0-3, the heuristics' first plans 1.17x / 0.97x / 0.94x / 0.92x; cuDNN's ReLU of
slope 10 computed the wrong residual (``--residual-form relu10``), min(a, 10 a) the right one.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit
from models.cuda_graphs import replay_times_ms
from models.emotivoice.checkpoints import random_generator

SLOPE = 0.1
INVERSE_SLOPE = 1.0 / SLOPE
TEN = torch.full((1, 1, 1, 1), INVERSE_SLOPE)  # a pass-by-value operand: on the host
RESIDUAL_FORMS = ("min10", "relu10", "plain")


def stage_blocks(vocoder, stage: int) -> list[list[tuple[dict, dict]]]:
    """Per ResBlock1 of ``stage``: its (conv1, conv2) pairs as dicts of 2-D FP16 channels-last weights."""
    def as_2d(conv) -> dict:
        weight = conv.weight.detach().unsqueeze(2)  # (C_out, C_in, 1, K)
        return {"weight": weight.half().cuda().contiguous(memory_format=torch.channels_last),
                "bias": conv.bias.detach().half().cuda().view(1, -1, 1, 1),
                "dilation": conv.dilation[0], "padding": conv.padding[0], "kernel": conv.kernel_size[0]}

    per_stage = len(vocoder.resblocks) // len(vocoder.upsample_rates)
    blocks = vocoder.resblocks[stage * per_stage:(stage + 1) * per_stage]
    return [[(as_2d(c1), as_2d(c2)) for c1, c2 in zip(block.convs1, block.convs2)] for block in blocks]


def compiled_block(blocks):
    def conv(x, spec):
        return F.conv2d(x, spec["weight"], spec["bias"].view(-1), padding=(0, spec["padding"]),
                        dilation=(1, spec["dilation"]))

    def block(x, mask):  # x (B, C, 1, T) channels-last, mask (B, 1, 1, T)
        total = None
        for pairs in blocks:
            y = x
            for conv1, conv2 in pairs:
                residual = conv(F.leaky_relu(y, SLOPE) * mask, conv1)
                y = y + conv(F.leaky_relu(residual, SLOPE) * mask, conv2)
            total = y if total is None else total + y
        return F.leaky_relu(total / len(blocks), SLOPE) * mask  # what the next upsampling reads

    return torch.compile(block, dynamic=False)


class FusedConv:
    """One cuDNN graph: mask * lrelu(conv(a) + bias [+ lrelu_10(residual)])."""

    def __init__(self, cudnn, handle, a, spec, mask, residual_form: str | None):
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        self.x = graph.tensor_like(a)
        self.w = graph.tensor_like(spec["weight"])
        self.b = graph.tensor_like(spec["bias"])
        self.m = graph.tensor_like(mask)
        y = graph.conv_fprop(image=self.x, weight=self.w, padding=[0, spec["padding"]], stride=[1, 1],
                             dilation=[1, spec["dilation"]], compute_data_type=cudnn.data_type.FLOAT)
        y = graph.add(a=y, b=self.b)
        self.r, self.ten, self.residual_form = None, None, residual_form
        if residual_form is not None:
            self.r = graph.tensor_like(a)
            y = graph.add(a=y, b=self._residual(cudnn, graph, residual_form))
        y = graph.mul(a=graph.relu(input=y, negative_slope=SLOPE), b=self.m)
        y.set_output(True).set_data_type(cudnn.data_type.HALF).set_dim(list(a.shape)).set_stride(list(a.stride()))
        self.y = y
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans(cudnn.build_plan_policy.ALL)
        self.graph, self.spec, self.handle = graph, spec, handle
        self.plan_count = graph.get_execution_plan_count()
        sizes = [graph.get_workspace_size_plan_at_index(i) for i in range(self.plan_count)]
        self.workspace = torch.empty(max(sizes + [1]), device="cuda", dtype=torch.uint8)
        self.plan = 0
        self.plan_times_ms: list[float] = []

    def _residual(self, cudnn, graph, form: str):
        """The residual stream as the graph reads it: the activation itself ("plain", a diagnostic),
        or x = lrelu_10(a) as cuDNN's ReLU with slope 10 ("relu10") or as min(a, 10 a) ("min10")."""
        if form == "plain":
            return self.r
        if form == "relu10":
            return graph.relu(input=self.r, negative_slope=INVERSE_SLOPE)
        if form == "min10":
            self.ten = graph.tensor(dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=cudnn.data_type.FLOAT,
                                    is_pass_by_value=True, name="ten")
            return graph.min(input0=self.r, input1=graph.mul(a=self.r, b=self.ten))
        raise ValueError(f"unknown residual form {form!r}")

    def pick_fastest_plan(self, a, mask, out, residual=None, repeats: int = 5) -> None:
        """Time every plan cuDNN built for this graph and keep the fastest (cuDNN's own autotuning)."""
        for index in range(self.plan_count):
            self.plan = index
            try:
                self(a, mask, out, residual)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(repeats):
                    self(a, mask, out, residual)
                end.record()
                end.synchronize()
                self.plan_times_ms.append(start.elapsed_time(end) / repeats)
            except Exception:  # noqa: BLE001 -- a plan that fails to run is not a candidate
                self.plan_times_ms.append(float("inf"))
        self.plan = min(range(self.plan_count), key=self.plan_times_ms.__getitem__)

    def __call__(self, a, mask, out, residual=None):
        pack = {self.x: a, self.w: self.spec["weight"], self.b: self.spec["bias"], self.m: mask, self.y: out}
        if self.r is not None:
            pack[self.r] = residual
        if self.ten is not None:
            pack[self.ten] = TEN
        self.graph.execute_plan_at_index(pack, self.workspace, self.plan, handle=self.handle)
        return out

    def reference(self, a, mask, residual=None):
        """The same formula in PyTorch, for the self-check."""
        y = F.conv2d(a, self.spec["weight"], self.spec["bias"].view(-1), padding=(0, self.spec["padding"]),
                     dilation=(1, self.spec["dilation"])).float()
        if residual is not None:
            y = y + (residual.float() if self.residual_form == "plain"
                     else F.leaky_relu(residual.float(), INVERSE_SLOPE))
        return F.leaky_relu(y, SLOPE) * mask


def fused_block(cudnn, handle, blocks, x, mask, residual_form: str):
    """The block as cuDNN graphs: run(x, mask) -> output, buffers preallocated; and each graph kind's check."""
    t = torch.empty_like(x)
    outs = [[torch.empty_like(x), torch.empty_like(x)] for _ in blocks]
    first = [[FusedConv(cudnn, handle, x, c1, mask, None) for c1, _ in pairs] for pairs in blocks]
    second = [[FusedConv(cudnn, handle, x, c2, mask, residual_form) for _, c2 in pairs] for pairs in blocks]

    activate = torch.compile(lambda x, mask: F.leaky_relu(x, SLOPE) * mask, dynamic=False)
    mean_of_streams = torch.compile(  # the residual streams read back from their activations
        lambda finals, mask: F.leaky_relu(sum(F.leaky_relu(a.float(), INVERSE_SLOPE) for a in finals)
                                          / len(finals), SLOPE).mul(mask).half(), dynamic=False)

    a0 = activate(x, mask)
    checks = {}
    for r, pairs in enumerate(blocks):  # each graph against PyTorch, then cuDNN's plans timed
        for j in range(len(pairs)):
            first[r][j].pick_fastest_plan(a0, mask, t)
            second[r][j].pick_fastest_plan(t, mask, outs[r][0], residual=a0)
    graphs = [conv for row in first + second for conv in row]
    fastest = [conv.plan for conv in graphs]
    others = [(f"conv2_{form}", FusedConv(cudnn, handle, x, blocks[0][0][1], mask, form))
              for form in RESIDUAL_FORMS if form != residual_form]
    for _, conv in others:
        conv.pick_fastest_plan(t, mask, outs[0][0], residual=a0)
    for name, conv, inputs in [("conv1", first[0][0], (a0, mask, t)),
                               (f"conv2_{residual_form}", second[0][0], (t, mask, outs[0][0], a0))] + [
                               (name, conv, (t, mask, outs[0][0], a0)) for name, conv in others]:
        got = conv(*inputs).float()
        want = conv.reference(inputs[0], inputs[1], *inputs[3:])
        checks[name] = {"max_abs_diff_over_peak": ((got - want).abs().max() / want.abs().max()).item(),
                        "plans": conv.plan_count, "plan_ms": conv.plan_times_ms,
                        "plan": getattr(conv.graph, "get_plan_name_at_index", lambda i: str(i))(conv.plan)}

    def run(x, mask):
        a0 = activate(x, mask)
        finals = []
        for r, pairs in enumerate(blocks):
            a = a0
            for j in range(len(pairs)):
                first[r][j](a, mask, t)
                out = outs[r][j % 2]
                second[r][j](t, mask, out, residual=a)
                a = out
            finals.append(a)
        return mean_of_streams(finals, mask)

    def use_plans(which: str) -> None:
        """"fastest": each graph's timed best; "heuristic": the plan cuDNN's heuristics rank first."""
        for conv, plan in zip(graphs, fastest):
            conv.plan = plan if which == "fastest" else 0

    return run, checks, use_plans


def replay_ms(fn, args, repeats: int) -> tuple[list[float], torch.Tensor]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    return replay_times_ms(graph, repeats + 3)[3:], out


def kernel_table(fn, args, calls: int = 3, top: int = 12) -> list[dict]:
    """Each CUDA kernel's time per call of ``fn`` (eager launches, not a graph), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(*args)
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:120], "ms_per_call": e.device_time_total / 1e3 / calls, "count_per_call": e.count / calls}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda row: -row["ms_per_call"])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--frames", type=int, default=200, help="the longest row's frames (200: 3.2 s)")
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--residual-form", choices=RESIDUAL_FORMS[:2], default="min10",
                        help="how the fused graphs read the residual stream back from an activation")
    parser.add_argument("--profile", action="store_true", help="also list the compiled arm's kernels")
    add_allow_dirty_argument(parser)
    args = parser.parse_args()
    origin = publication_or_exit(parser, Path(__file__).resolve().parents[1], args.out, args.allow_dirty)
    import cudnn  # nvidia-cudnn-frontend; after torch, whose cuDNN it loads

    torch.manual_seed(0)
    vocoder = random_generator(0).inference_copy().generator.eval()
    handle = cudnn.create_handle()
    report = {"what": "EmotiVoice HiFi-GAN stage blocks: compiled (cuDNN + Inductor) vs cuDNN fused epilogues",
              "provenance": origin, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn_backend": cudnn.backend_version(), "rows": args.rows, "frames": args.frames,
              "repeats": args.repeats, "stages": {}}
    frame_lengths = torch.randint(int(args.frames * 0.85), args.frames + 1, (args.rows,))
    frame_lengths[0] = args.frames
    factor = 1
    with torch.inference_mode():
        for stage, rate in enumerate(vocoder.upsample_rates):
            factor *= rate
            if stage not in args.stages:
                continue
            blocks = stage_blocks(vocoder, stage)
            channels, steps = blocks[0][0][0]["weight"].shape[0], args.frames * factor
            x = torch.randn(args.rows, channels, 1, steps, device="cuda", dtype=torch.half)
            x = x.contiguous(memory_format=torch.channels_last)
            mask = (torch.arange(steps)[None, :] < (frame_lengths * factor)[:, None]).half().cuda()
            mask = mask.view(args.rows, 1, 1, steps)
            entry = {"channels": channels, "steps": steps}
            compiled = compiled_block(blocks)
            times, reference = replay_ms(compiled, (x, mask), args.repeats)
            entry["compiled_ms"] = statistics.median(times)
            if args.profile:
                entry["compiled_kernels"] = kernel_table(compiled, (x, mask))
            try:
                cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
                began = time.perf_counter()
                run, entry["cudnn_checks"], use_plans = fused_block(cudnn, handle, blocks, x, mask, args.residual_form)
                entry["cudnn_build_and_autotune_s"] = time.perf_counter() - began
                stream_holder = {}

                def on_stream(x, mask):  # the handle follows whichever stream captures
                    stream = torch.cuda.current_stream().cuda_stream
                    if stream_holder.get("stream") != stream:
                        cudnn.set_stream(handle=handle, stream=stream)
                        stream_holder["stream"] = stream
                    return run(x, mask)

                times, fused = replay_ms(on_stream, (x, mask), args.repeats)
                entry["cudnn_fused_ms"] = statistics.median(times)
                use_plans("heuristic")
                stream_holder.clear()
                times, _ = replay_ms(on_stream, (x, mask), args.repeats)
                entry["cudnn_fused_heuristic_plans_ms"] = statistics.median(times)
                use_plans("fastest")
                entry["speedup"] = entry["compiled_ms"] / entry["cudnn_fused_ms"]
                peak = reference.float().abs().max().item()
                entry["max_abs_diff_over_peak"] = (fused.float() - reference.float()).abs().max().item() / peak
            except Exception as error:  # noqa: BLE001 -- which graph cuDNN refuses is the finding
                entry["cudnn_fused_error"] = f"{type(error).__name__}: {error}"[:2000]
            report["stages"][f"stage {stage}"] = entry
            print(stage, entry, flush=True)
    print_and_save_report(report, args.out)


if __name__ == "__main__":
    main()
