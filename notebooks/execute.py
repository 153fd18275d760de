"""Execute a reviewer notebook and save it with its outputs.

    python -m notebooks.execute                                         # outputs/mlflow.db, latest parent run
    python -m notebooks.execute --tracking-uri sqlite:////abs/path/mlflow.db --run-id <parent run id>
    python -m notebooks.execute --notebook notebooks/serving_loadtests.ipynb [--loadtest-dir docs/results]
    python -m notebooks.execute --notebook notebooks/h200_engines.ipynb [--results-dir docs/results]
    python -m notebooks.execute --notebook notebooks/gpt_sovits_engine.ipynb [--results-dir docs/results]
    python -m notebooks.execute --notebook notebooks/kokoro.ipynb [--results-dir docs/results]
    python -m notebooks.execute --notebook notebooks/emotivoice_engine.ipynb [--results-dir docs/results]

The notebooks read their parameters from environment variables, which this sets for the kernel:
compare_variants.ipynb TTS_MLFLOW_URI, TTS_MLFLOW_EXPERIMENT and TTS_MLFLOW_RUN_ID (an MLflow store);
serving_loadtests.ipynb TTS_LOADTEST_DIR (a folder of serve.loadtest reports); h200_engines.ipynb
TTS_RESULTS_DIR (a folder of evaluate.gpu_engines reports and their audio scores); gpt_sovits_engine.ipynb
the same TTS_RESULTS_DIR (GPT-SoVITS's H200 benchmark reports); kokoro.ipynb the same TTS_RESULTS_DIR (Kokoro's
CPU, FLOP, H200 and TensorRT reports and its training logs); emotivoice_engine.ipynb the same TTS_RESULTS_DIR
(EmotiVoice's H100 and H200 engine benches and load tests). The kernel starts in notebooks/, as in Jupyter.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parent
COMPARE_VARIANTS = NOTEBOOKS_DIR / "compare_variants.ipynb"
SERVING_LOADTESTS = NOTEBOOKS_DIR / "serving_loadtests.ipynb"
H200_ENGINES = NOTEBOOKS_DIR / "h200_engines.ipynb"
GPT_SOVITS_ENGINE = NOTEBOOKS_DIR / "gpt_sovits_engine.ipynb"
KOKORO = NOTEBOOKS_DIR / "kokoro.ipynb"
EMOTIVOICE_ENGINE = NOTEBOOKS_DIR / "emotivoice_engine.ipynb"


def execute_notebook(path: Path = COMPARE_VARIANTS, tracking_uri: str | None = None, experiment: str | None = None,
                     run_id: str | None = None, output_path: Path | None = None,
                     timeout_s: int = 600, loadtest_dir: Path | None = None,
                     results_dir: Path | None = None) -> nbformat.NotebookNode:
    """Run every cell (each within ``timeout_s``), write the executed notebook to ``output_path`` (default: in place).

    A failing cell raises ``nbclient.exceptions.CellExecutionError`` naming the cell; nothing is written then.
    """
    notebook = nbformat.read(path, as_version=4)
    parameters = {"TTS_MLFLOW_URI": tracking_uri, "TTS_MLFLOW_EXPERIMENT": experiment, "TTS_MLFLOW_RUN_ID": run_id,
                  "TTS_LOADTEST_DIR": None if loadtest_dir is None else str(Path(loadtest_dir).resolve()),
                  "TTS_RESULTS_DIR": None if results_dir is None else str(Path(results_dir).resolve())}
    env = {**os.environ, **{k: v for k, v in parameters.items() if v is not None}}
    client = NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(Path(path).resolve().parent)}})
    client.execute(env=env)
    nbformat.write(notebook, output_path or path)
    return notebook


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m notebooks.execute", description=__doc__.split("\n")[0])
    parser.add_argument("--notebook", type=Path, default=COMPARE_VARIANTS)
    parser.add_argument("--tracking-uri", help="default: $TTS_MLFLOW_URI, else sqlite:///<repo>/outputs/mlflow.db")
    parser.add_argument("--experiment", help="default: $TTS_MLFLOW_EXPERIMENT, else tts-compress")
    parser.add_argument("--run-id", help="a parent run; default: the latest finished one")
    parser.add_argument("--output", type=Path, help="default: overwrite the notebook in place")
    parser.add_argument("--loadtest-dir", type=Path, help="serving_loadtests: default docs/results")
    parser.add_argument("--results-dir", type=Path,
                        help="h200_engines, gpt_sovits_engine, kokoro, emotivoice_engine: default docs/results")
    parser.add_argument("--timeout-s", type=int, default=600, help="per cell")
    args = parser.parse_args(argv)
    execute_notebook(args.notebook, args.tracking_uri, args.experiment, args.run_id, args.output, args.timeout_s,
                     args.loadtest_dir, args.results_dir)
    print(f"executed {args.notebook} -> {args.output or args.notebook}")


if __name__ == "__main__":
    main()
