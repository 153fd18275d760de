"""The reviewer notebook runs against a fresh debug run's MLflow store, and the run logged its selection."""
import json
from pathlib import Path

import mlflow
import pytest

from compress.pipeline import run
from compress.run_config import settings_from_config
from notebooks.execute import (COMPARE_VARIANTS, EMOTIVOICE_ENGINE, GPT_SOVITS_ENGINE, H200_ENGINES, KOKORO,
                               SERVING_LOADTESTS, execute_notebook)

pytestmark = pytest.mark.slow  # loads the real voice

DEBUG_VARIANTS = ["original_onnx", "teacher"]


RESULTS = Path(__file__).resolve().parent.parent.parent / "docs" / "results"


def outputs_without_errors(executed) -> list:
    """Every code cell's outputs of an executed notebook; fails if any cell raised."""
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    return outputs


def joined(outputs: list, mime: str) -> str:
    return "".join(o.data[mime] for o in outputs if mime in o.get("data", {}))


def pngs(outputs: list) -> int:
    return len([o for o in outputs if "image/png" in o.get("data", {})])


@pytest.fixture(scope="module")
def debug_store(tmp_path_factory):
    """The debug pipeline into a temporary store whose artifacts also stay under the temporary folder."""
    from tests.conftest import compose_config

    tmp = tmp_path_factory.mktemp("notebook")
    resolved = compose_config(tmp, ["+experiment=debug", "data.max_eval_sentences=1"])
    settings = settings_from_config(resolved)
    (tmp / "outputs").mkdir()
    mlflow.set_tracking_uri(settings.tracking.tracking_uri)
    mlflow.create_experiment(settings.tracking.experiment_name, artifact_location=(tmp / "artifacts").as_uri())
    rows = run(settings, resolved)
    return settings, rows, tmp


def test_pipeline_logs_the_selection(debug_store):
    settings, rows, tmp = debug_store
    client = mlflow.MlflowClient(settings.tracking.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(settings.tracking.experiment_name).experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    selection_path = client.download_artifacts(parent.info.run_id, "selection/selection.json", str(tmp))
    selection = json.loads(Path(selection_path).read_text())
    assert set(selection["eligibility"]) == set(DEBUG_VARIANTS)
    assert selection["objective_metric"] == "rtf_cpu_b1"  # no GPU figures in a debug run: the fallback
    assert selection["champion"] == parent.data.tags["selection_champion"] == selection["ranking"][0]
    for child in runs:
        if child is not parent:
            assert child.data.tags["selection_eligible"] in ("true", "false")
    assert (Path(settings.paths.run_dir) / "pareto.png").is_file()


def test_notebook_executes_against_the_store(debug_store, tmp_path):
    settings, rows, _ = debug_store
    executed = execute_notebook(COMPARE_VARIANTS, tracking_uri=settings.tracking.tracking_uri,
                                experiment=settings.tracking.experiment_name, output_path=tmp_path / "out.ipynb",
                                timeout_s=120)
    outputs = [o for cell in executed.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    html = [o.data["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    table = next(h for h in html if "<table" in h)
    for name in DEBUG_VARIANTS:
        assert f">{name}</th>" in table
    assert sum("<audio" in h for h in html) == len(DEBUG_VARIANTS)  # one player per variant
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 2  # Pareto plot and spectrograms; no int8 variant: a note instead of the bar chart
    notes = [o.data["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert any("No variant of this run logged a sensitivity table" in n for n in notes)


def test_serving_notebook_reads_the_recorded_load_tests(tmp_path):
    """Against the committed reports (docs/results): the H200 plot, the levels that meet the target,
    the streaming table and the CPU comparison, with no cell failing."""
    outputs = outputs_without_errors(execute_notebook(SERVING_LOADTESTS, loadtest_dir=RESULTS,
                                                      output_path=tmp_path / "serving.ipynb", timeout_s=120))
    assert pngs(outputs) == 2  # H200 curves, CPU bars
    notes = joined(outputs, "text/markdown")
    assert "levels meet the target" in notes and "cpu_4_loadtest_unbatched_t2.json" in notes
    html = joined(outputs, "text/html")
    # The recorded H200 run met the target at concurrency 48 with 730 req/s (docs/benchmarks.md).
    assert "h200_5d_loadtest_w3.json" in html and "729.9" in html
    # EmotiVoice's model path without HTTP (session 41): batch 512 at 1,525.5 sentences/s on an H100.
    assert "h100_41_emotivoice_replay_b512.json" in html and "1525.5" in html


def test_serving_notebook_names_a_folder_without_reports(tmp_path):
    from nbclient.exceptions import CellExecutionError

    with pytest.raises(CellExecutionError, match="no serve.loadtest reports"):
        execute_notebook(SERVING_LOADTESTS, loadtest_dir=tmp_path, output_path=tmp_path / "serving.ipynb",
                         timeout_s=120)


def test_h200_engines_notebook_reads_the_recorded_calls(tmp_path):
    """Against the committed engines reports: every row, the batch-16 plot, and the verdict on #19's
    target, where only session 22's duration-student engine meets 1e-4 beside the teacher."""
    outputs = outputs_without_errors(execute_notebook(H200_ENGINES, results_dir=RESULTS,
                                                      output_path=tmp_path / "h200.ipynb", timeout_s=120))
    assert pngs(outputs) == 1
    notes = [o.data["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
    assert notes[-1] == "**Meets the target:** lite_dur_fp16/compile_cuda_graphs in h200_22_engines_compile"
    tables = joined(outputs, "text/html")
    assert "not measured" in tables  # session 20's autotuning call saved no audio


def test_h200_engines_notebook_names_a_folder_without_reports(tmp_path):
    from nbclient.exceptions import CellExecutionError

    with pytest.raises(CellExecutionError, match="no gpu_engines reports"):
        execute_notebook(H200_ENGINES, results_dir=tmp_path, output_path=tmp_path / "h200.ipynb", timeout_s=120)


def test_gpt_sovits_notebook_reads_the_recorded_engine_calls(tmp_path):
    """Against the committed reports (docs/results): the 64-stream rows with the target, the
    admission costs and kernel tables, batch 1 and memory, with no cell failing and the call whose
    figures are not results left out."""
    outputs = outputs_without_errors(execute_notebook(GPT_SOVITS_ENGINE, results_dir=RESULTS,
                                                      output_path=tmp_path / "gpt_sovits.ipynb", timeout_s=120))
    assert pngs(outputs) == 2  # streams bars, admission curves
    notes = joined(outputs, "text/markdown")
    # Session 25's final call met the 64-stream target greedy (54,771) and sampling (51,895); the
    # batch-1 target was missed in every call (session 28's folded FFN the fastest); the FP16 memory
    # ratio was missed in session 25 after the prefill graphs and met again in session 28.
    assert "h200_25_gpt_sovits_streams_final.json` (54,771)" in notes and "(51,895)" in notes
    assert "Left out: `h200_24_gpt_sovits_shards.json`" in notes
    assert "`h200_25_gpt_sovits_t2s.json` engine_fp16_persistent_graphs 2,622" in notes
    assert "`h200_25_gpt_sovits_t2s.json` missed" in notes and "`h200_8_gpt_sovits_t2s.json` met" in notes
    assert "`h200_28_gpt_sovits_t2s.json` engine_fp16_persistent_folded_ffn_graphs 2,869" in notes
    assert "`h200_28_gpt_sovits_t2s.json` met" in notes
    # The persistent step's sweeps: session 33's out fold the fastest batch-1 row, still missed.
    assert "`h200_33_t2s_folds.json` persistent_fp16_p132_w8_asm1_fold_ffn+out 3,361 (missed" in notes
    assert "`h200_8_t2s_persistent_sweep_a.json` persistent_fp16_p128_w8_asm1 2,768 (missed" in notes


def test_kokoro_notebook_reads_the_recorded_reports(tmp_path):
    """Against the committed Kokoro reports (docs/results): the CPU runs against the shipped int8 graph,
    the FLOP counts, the H200 engines, the graphs' operators and the training log, with no cell failing."""
    outputs = outputs_without_errors(execute_notebook(KOKORO, results_dir=RESULTS,
                                                      output_path=tmp_path / "kokoro.ipynb", timeout_s=120))
    assert pngs(outputs) == 3  # CPU ratios of the latest run, H200 best RTF per session, training losses
    notes = joined(outputs, "text/markdown")
    # The Lite decoder is the only graph past 2x in sessions 26-28 (2.07x, 2.11x after 8,000 CPU steps,
    # 2.40x for the H200 student, 2.30x after 2,200 more CPU steps) but misses both quality bars there.
    assert "**`cpu_26_kokoro_cpu_lite.json`: CPU target missed.**" in notes
    assert "lite_cpu_graph 2.07x" in notes
    assert "lite_cpu_graph quality missed (DNSMOS 3.439 < 3.669, spk_sim 0.882 < 0.95)" in notes
    assert "lite_cpu_graph quality missed (DNSMOS 3.584 < 3.669, spk_sim 0.916 < 0.95)" in notes
    assert "lite_cpu_graph quality missed (DNSMOS 3.652 < 3.669, spk_sim 0.932 < 0.95)" in notes
    assert "lite_cpu_graph quality missed (DNSMOS 3.642 < 3.669, spk_sim 0.934 < 0.95)" in notes  # + CPU steps
    # Session 30: the wider (144, 72) student passes DNSMOS but not the speaker bar; after its
    # long-segment fine-tune both Lite graphs meet the whole CPU target.
    assert "lite_cpu_graph quality missed (spk_sim 0.935 < 0.95)" in notes
    assert "**`cpu_30_kokoro_cpu_lite_long_segments.json`: CPU target met.**" in notes
    assert "Both: lite_cpu_graph, lite_cpu_graph_int8." in notes
    assert ("Graphs meeting both in any run: lite_cpu_graph (`cpu_30_kokoro_cpu_lite_long_segments.json`), "
            "lite_cpu_graph_int8 (`cpu_30_kokoro_cpu_lite_long_segments.json`), " in notes)
    # Session 31: the committed float16 file of that student meets it too.
    assert "**`cpu_31_kokoro_cpu_lite_committed_quiet.json`: CPU target met.**" in notes
    assert "Speed (>= 2x): lite_cpu_graph 2.06x, lite_cpu_graph_int8 2.07x." in notes
    # Session 33, the latest run, read first: the (128, 64) student meets it faster; its INT8 graph
    # misses DNSMOS by 0.005.
    assert "**`cpu_33_kokoro_cpu_lite_128_64.json`: CPU target met.**" in notes
    assert ("In `cpu_33_kokoro_cpu_lite_128_64.json` the fastest graph is lite_cpu_graph_int8 at 2.38x (quality "
            "missed); the fastest that keeps quality is lite_cpu_graph at 2.34x" in notes)
    assert "lite_cpu_graph_int8 quality missed (DNSMOS 3.664 < 3.669)" in notes
    assert "Lite (128, 64) 16.64 (3.21x fewer)" in notes
    # The H200 (random weights): batch 1 met by session 22's compiled engine; batch 16 met in session 34
    # with channels-last convolutions at the width (128, 64); session 33 (1.2x over at that width) and
    # session 28 (1.6x over) stay in the per-session list, each named as such.
    assert "**H200 batch 1, RTF <= 0.002: met**" in notes and "**met**, first in session 22" in notes
    assert ("**met**, first in session 34; best compiled_graphs_fp16 channels_last_stats32_text_tf32_stacked_fused_lstms "
            "(width (128, 64)) 0.000193" in notes)
    assert "**H200 batch 16, RTF <= 0.0002: met**" in notes
    assert "session 33 compiled_graphs_fp16 ncw_stats32_text_tf32 (width (128, 64)) 0.000241" in notes
    assert "session 28 compiled_graphs_fp16 (Lite (128, 64)) 0.000322" in notes
    assert "session 23 compiled_graphs_fp16 0.000445" in notes
    # The shipped graph carries STFT and NonZero and TensorRT's parser refuses it; ours build and carry
    # neither; session 27's bench reads every graph file's operators, the Lite graphs' included.
    assert "original int8 (as shipped) (405 nodes refused by the parser)" in notes
    assert "exported graphs: met** for every graph a report checked; not checked: none." in notes
    assert "The shipped graph: NonZero, STFT." in notes
    tables = joined(outputs, "text/html")
    assert "cpu_26_kokoro_lite_train.log" in tables and "cpu_27_kokoro_lite_train_b_pool.log" in tables
    assert "h200_28_kokoro_lite_train_b.log" in tables  # the H200 run's logs too
    assert "cpu_28_kokoro_lite_train_continued.log" in tables
    assert "cpu_29_kokoro_lite_train_gan.log" in tables and "cpu_29_kokoro_lite_train_waveform.log" in tables
    assert "h100_30_kokoro_lite_train_144_72_c.log" in tables  # an H100 run's logs too
    assert "cpu_30_kokoro_lite_train_long_segments.log" in tables
    # Session 29's fine-tunes, scored on quality only: none reaches either bar.
    assert ("**`cpu_29_kokoro_lite_quality.json`** (6 students): DNSMOS 3.544-3.656 (bar 3.669" in notes
            and "spk_sim 0.912-0.934 (bar 0.95)" in notes and "Students meeting both: none." in notes)
    # Session 30's two students scored with band levels: only the long-segment fine-tune meets both.
    assert ("**`cpu_30_kokoro_lite_quality_band_levels.json`** (2 students): DNSMOS 3.682-3.710" in notes
            and "Students meeting both: s30ft/lite_144_72_long_500.safetensors." in notes)
    # Session 33: the (128, 64) student after the same long-segment fine-tune meets both; so does its
    # committed float16 file.
    assert "Students meeting both: checkpoints/lite_kokoro_jf_alpha.safetensors, s33/lite_128_64_long.safetensors." in notes
    assert ("**`cpu_33_kokoro_lite_quality_128_64_float16.json`** (1 students): DNSMOS 3.685-3.685" in notes
            and "Students meeting both: checkpoints/lite_kokoro_jf_alpha_128_64.safetensors." in notes)


def test_emotivoice_notebook_reads_the_recorded_reports(tmp_path):
    """Against the committed EmotiVoice reports (docs/results): each #16 target's verdict names the card and
    carries the figures of the reports themselves, computed here from the JSON."""
    outputs = outputs_without_errors(execute_notebook(EMOTIVOICE_ENGINE, results_dir=RESULTS,
                                                      output_path=tmp_path / "emotivoice.ipynb", timeout_s=120))
    assert pngs(outputs) == 3  # batch 1 per report, sentences/s by batch size, served levels
    notes = joined(outputs, "text/markdown")
    # Batch 1: the fastest engine of the released model (an engine with another vocoder is another model).
    report = json.loads((RESULTS / "h200_39_emotivoice_b1024_groups32.json").read_text())
    engine, figures = min(((name, figures) for name, figures in report["engines"].items() if "vocoder" not in figures),
                          key=lambda item: item[1]["total_ms"])
    speedup = report["batch1"]["eager_fp32"]["total_ms"] / figures["total_ms"]
    assert (f"- H200 `h200_39_emotivoice_b1024_groups32.json`: {engine} {figures['total_ms']:.2f} ms, "
            f"{speedup:.2f}x eager FP32: met") in notes
    assert "**H200: met**" in notes.split("**End to end")[0]
    # Dynamic batching: the same call's batch of 1,024, the first past 2,000 sentences/s on the H200.
    rate = figures["b1024_sentences_per_s"]
    assert rate >= 2_000 and f"{engine} {rate:,.1f} at b1024: met" in notes
    # End to end, Mandarin: front end + warm style + engine.
    end_to_end = json.loads((RESULTS / "h200_8_emotivoice_e2e.json").read_text())["end_to_end"]["zh"]
    assert f"{end_to_end['total_with_engine_ms']:.2f} ms = front end" in notes
    # Served: the one H200 load test (one sentence a request) misses; the best H100 run is named with its card.
    served = json.loads((RESULTS / "h200_15_emotivoice_serve.json").read_text())
    best_rps = max(level["throughput_rps"] for level in served["levels"])
    assert "sentences_per_request" not in served
    assert f"`h200_15_emotivoice_serve.json`: {best_rps:,.1f} sentences/s" in notes
    assert "**Served, at least 2,000 sentences/s on an H200.**" in notes and "**H200: not met**" in notes
    # The most served on any card: found here from the reports, so a later run that serves more moves it.
    rates = {path.name: max(json.loads(path.read_text()).get("sentences_per_s", {"": 0}).values())
             for path in RESULTS.glob("h[12]00_*emotivoice_serve*.json")
             if not path.name.endswith(("_stream.json", "_warmup.json"))}
    most = max(rates, key=rates.get)
    assert f"`{most}` on an H{most[1:4]}, {rates[most]:,.1f}" in notes
    # The ratio the report itself disowns is named, not counted.
    assert "Not counted: `h200_7_emotivoice_engines.json`" in notes


def test_emotivoice_notebook_names_a_folder_without_reports(tmp_path):
    from nbclient.exceptions import CellExecutionError

    with pytest.raises(CellExecutionError, match="no EmotiVoice reports"):
        execute_notebook(EMOTIVOICE_ENGINE, results_dir=tmp_path, output_path=tmp_path / "emotivoice.ipynb",
                         timeout_s=120)
