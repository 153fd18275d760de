#!/usr/bin/env bash
# Load test of the HTTP runtime on a GPU machine: starts `python -m serve` on 127.0.0.1, runs
# serve.loadtest against it (a warm-up level, then throughput and latency, then streaming time to
# first audio at concurrency 1), writes the JSON reports and the server log to $OUT, and stops the server.
#
# On a GPU machine with Python 3.12, torch, numpy, onnx and onnxruntime, in the repository root; the other
# packages come as cp312 wheels in $WHEELS (default .whl312; serve/gpu_wheels.txt lists them), installed into
# $SITE with --target so the machine's own packages stay as they are (or, with the front ends' packages
# too, in two carried parts: `bash scripts/device_deps.sh --install-serve` fills $SITE's default, and this
# script then installs nothing; scripts/device_deps.sh says how). Copy the voice as a converted float16
# voice (the family's converter, e.g. python -m models.<family>.voice ... --out .device/voice16/...), half
# the ONNX's bytes:
#   OUT=$OUT bash serve/gpu_loadtest.sh
#   OUT=$OUT ENGINE=eager bash serve/gpu_loadtest.sh           # the eager PyTorch teacher, for comparison
#   OUT=$OUT PROFILE=1 bash serve/gpu_loadtest.sh              # + py-spy stacks of the server under load
#   OUT=$OUT WORKERS=2 MPS=1 bash serve/gpu_loadtest.sh        # the workers' kernels share the GPU through CUDA MPS
#   OUT=$OUT MODEL=emotivoice ENGINE=cuda_graphs bash serve/gpu_loadtest.sh  # another family (random weights without its files)
#   OUT=$OUT MODEL=emotivoice SENTENCE_SET=eval_zh SENTENCES_PER_REQUEST=8 bash serve/gpu_loadtest.sh  # Mandarin text
# It writes a dozen files; to bring them back as one, write elsewhere and pack them:
#   OUT=/tmp/r bash serve/gpu_loadtest.sh; tar czf "$OUT/results.tgz" -C /tmp/r .
# What the measured level did (the GPU's busy share, graphs captured under load, each worker's warm-up):
#   python -m serve.loadtest_summary --dir /tmp/r --sample-rate-hz 16000   # the voice's rate: EmotiVoice 16 kHz
# Settings (environment, defaults after ':-'; the defaults are the configuration of the measured run in
# docs/benchmarks.md); the issue's H200 target is >= 500 req/s at P95 <= 100 ms and, streaming, a first
# audio chunk within 20 ms at concurrency 1.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the folder the reports go to}
WHEELS=${WHEELS:-.whl312}
SITE=${SITE:-/tmp/serve_site}
MODEL=${MODEL:-}                     # a conf/model group other than the default (e.g. emotivoice); it brings its own voice
VOICE=${VOICE:-$([ -n "$MODEL" ] || echo .device/voice16/en_US-joe-medium.safetensors)}  # or the voice's .onnx, or bundled:joe where installed
SOURCE=${SOURCE:-teacher}            # teacher: the PyTorch port (CUDA); fp16/bf16: it in half precision; original_onnx: onnxruntime on the host CPU
DEVICE=${DEVICE:-cuda}
ENGINE=${ENGINE:-compile}            # the teacher's engine: eager | cuda_graphs | compile | aoti (models/<family>/engines.py)
PORT=${PORT:-8000}
CONCURRENCY=${CONCURRENCY:-1,16,32,40,48,64}  # Little's law: 500 req/s at ~100 ms needs ~50 in flight
REQUESTS=${REQUESTS:-2000}           # per level; MAX_SECONDS stops a level first on a slow engine
MAX_SECONDS=${MAX_SECONDS:-45}
PROCESSES=${PROCESSES:-4}            # client processes: one Python client tops out below the server
MAX_BATCH=${MAX_BATCH:-32}
WORKERS=${WORKERS:-3}                # server processes on the port, each with its own engine and batcher
MAX_WAIT_MS=${MAX_WAIT_MS:-0}          # 0: a batch leaves as soon as the GPU is free; load fills the next one
IN_FLIGHT=${IN_FLIGHT:-2}            # batches per worker at once: one prepared on the host while the GPU runs the other
CUDNN_BENCHMARK=${CUDNN_BENCHMARK:-false}  # true: cuDNN times each new shape, and shapes the warm-up missed stall under load
MAX_BATCH_PHONEMES=${MAX_BATCH_PHONEMES:-8192}  # rows x padded ids per batch; batches of 1,024 short sentences need 131072
ENGINE_OPTIONS=${ENGINE_OPTIONS:-{\}}  # the family's engine settings, e.g. {frame_groups:32,min_group_rows:32} (EmotiVoice)
WARMUP_SCALES=${WARMUP_SCALES:-[0.8,1.0,1.25]}  # paces the start-up warm-up captures; the load test asks only 1.0
SENTENCES_PER_REQUEST=${SENTENCES_PER_REQUEST:-1}  # sentences in each request's input; reports count sentences/s too
SENTENCE_SET=${SENTENCE_SET:-eval}   # eval: English, 8-12 words; eval_zh: Mandarin, 13-19 characters (texts/README.md)
SENTENCE_LENGTH=${SENTENCE_LENGTH:-}  # MIN-MAX words (characters in Mandarin); empty: the set's (serve.loadtest)
LENGTH_BUCKETS=${LENGTH_BUCKETS:-[512]}  # one batcher group: the engine pads to its own text buckets anyway
THREADS=${THREADS:-4}                # onnxruntime intra-op threads (original_onnx)
READY_TIMEOUT_S=${READY_TIMEOUT_S:-300}  # seconds the server may take to load and warm up (compiled engines: minutes)
GC_FREEZE=${GC_FREEZE:-true}         # false: the garbage collector keeps scanning the warm heap (serve/gc_pauses.py), an A/B
GC_FULL_AFTER=${GC_FULL_AFTER:-100}  # generation-1 collections before a full one may run once warm (CPython's default: 10)
QUEUE_CAPACITY=${QUEUE_CAPACITY:-512}  # requests a worker admits at once; past it 503 queue_full, and per client 429
PROFILE=${PROFILE:-0}                # 1: py-spy records the server's processes over the measured levels
MPS=${MPS:-0}                        # 1: serve.gpu_sharing=mps: the workers' kernels share the GPU at once, not in time slices
STREAMING=${STREAMING:-$([ "$SOURCE" = teacher ] && [ "$ENGINE" = eager ] && echo decoder_chunks || echo sentence)}

if [ "$SOURCE" = original_onnx ] && [[ "$VOICE" == *.safetensors ]]; then
  echo "SOURCE=original_onnx runs the voice's ONNX graph: set VOICE to the voice's .onnx (or bundled:joe)" >&2
  exit 2
fi
mkdir -p "$OUT" "$SITE"
if compgen -G "$WHEELS/*.whl" >/dev/null && [ ! -e "$SITE/.installed" ]; then  # once per machine, not per run
  python -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl && touch "$SITE/.installed"
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"  # py-spy's binary
if ! python -c "import serve.__main__, serve.app, serve.loadtest, httpx" 2>"$OUT/import_error.txt"; then
  echo "the runtime does not import here; see $OUT/import_error.txt and serve/gpu_wheels.txt" >&2
  exit 3
fi
rm -f "$OUT/import_error.txt"
GPU_SHARING=time_slices
if [ "$MPS" = 1 ]; then  # the server starts its own MPS daemon before its workers (serve/gpu_sharing.py)
  command -v nvidia-cuda-mps-control >/dev/null || { echo "MPS=1 needs nvidia-cuda-mps-control on PATH" >&2; exit 2; }
  GPU_SHARING=mps
  export CUDA_MPS_LOG_DIRECTORY=$OUT/mps_log  # the daemon's log comes back with the reports
fi

python -m serve ${MODEL:+model="$MODEL"} ${VOICE:+serve.voice="$VOICE"} serve.source="$SOURCE" serve.device="$DEVICE" serve.port="$PORT" \
  serve.torch_engine="$ENGINE" serve.aoti_package_dir=/tmp/serve_aoti serve.workers="$WORKERS" \
  serve.threads="$THREADS" serve.max_batch_size="$MAX_BATCH" serve.max_wait_ms="$MAX_WAIT_MS" \
  serve.batches_in_flight="$IN_FLIGHT" serve.length_buckets="$LENGTH_BUCKETS" serve.max_batch_phonemes="$MAX_BATCH_PHONEMES" \
  ++serve.engine_options="$ENGINE_OPTIONS" serve.warmup_length_scales="$WARMUP_SCALES" serve.cudnn_benchmark="$CUDNN_BENCHMARK" \
  serve.queue_capacity="$QUEUE_CAPACITY" serve.max_requests_per_client="$QUEUE_CAPACITY" serve.gc_freeze="$GC_FREEZE" serve.gc_full_collection_after="$GC_FULL_AFTER" serve.gpu_sharing="$GPU_SHARING" serve.streaming="$STREAMING" serve.access_log=false hydra.run.dir=/tmp/serve_hydra \
  >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
GPU_LOG_PID=
if command -v nvidia-smi >/dev/null; then  # GPU busy % every 200 ms: says whether the GPU or the server is the limit
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 200 >"$OUT/gpu_utilisation.csv" &
  GPU_LOG_PID=$!
fi
trap 'kill -TERM $SERVER_PID $GPU_LOG_PID 2>/dev/null || true; wait $SERVER_PID 2>/dev/null || true' EXIT

URL=http://127.0.0.1:$PORT
READY_BY=$(( $(date +%s) + READY_TIMEOUT_S ))
until python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$URL/readyz', timeout=2).status != 200)" \
    2>/dev/null; do  # the model loads and warms up before /readyz answers 200
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "the server exited; see $OUT/server.log" >&2; exit 4; }
  if [ "$(date +%s)" -ge "$READY_BY" ]; then
    echo "the server was not ready after READY_TIMEOUT_S=$READY_TIMEOUT_S s; see $OUT/server.log" >&2
    exit 5
  fi
  sleep 1
done
LABEL="${MODEL:+$MODEL-}$SOURCE-$ENGINE-$DEVICE-w$WORKERS-f$IN_FLIGHT"  # the family too: reports of two families must not share names
SENTENCE_ARGS=(--sentence-set "$SENTENCE_SET")
if [ -n "$SENTENCE_LENGTH" ]; then SENTENCE_ARGS+=(--min-words "${SENTENCE_LENGTH%-*}" --max-words "${SENTENCE_LENGTH#*-}"); fi
# Warm-up level (reported apart): shapes the start-up warm-up did not cover get captured here.
python -m serve.loadtest --url "$URL" --concurrency 64 --requests 1500 --max-seconds 20 --processes "$PROCESSES" \
  --warmup 16 "${SENTENCE_ARGS[@]}" --ready-timeout-s "$READY_TIMEOUT_S" --label "$LABEL-warmup" \
  --out "$OUT/loadtest_${LABEL}_warmup.json"
scrape_metrics() {  # each worker answers its own /metrics (batch sizes, collections); the kernel picks which
  for worker in $(seq "$WORKERS"); do
    python -c "import urllib.request; print(urllib.request.urlopen('$URL/metrics', timeout=5).read().decode())" \
      >"$OUT/metrics_${LABEL}_$1$worker.txt" 2>&1 || true
  done
}
scrape_metrics before_  # counters as the measured levels start: with one worker the difference is theirs alone
PROFILER_PID=
if [ "$PROFILE" = 1 ]; then  # collapsed stacks of every server process (workers are its children), idle included
  py-spy record --pid "$SERVER_PID" --subprocesses --idle --rate 100 --format raw --nonblocking \
    --output "$OUT/server_profile_${LABEL}.txt" >"$OUT/py-spy.log" 2>&1 &
  PROFILER_PID=$!
fi
python -m serve.loadtest --url "$URL" --concurrency "$CONCURRENCY" --requests "$REQUESTS" --processes "$PROCESSES" \
  --max-seconds "$MAX_SECONDS" --sentences-per-request "$SENTENCES_PER_REQUEST" --warmup 16 "${SENTENCE_ARGS[@]}" \
  --ready-timeout-s "$READY_TIMEOUT_S" --label "$LABEL" \
  --out "$OUT/loadtest_${LABEL}.json"
if [ -n "$PROFILER_PID" ]; then kill -INT "$PROFILER_PID" 2>/dev/null || true; wait "$PROFILER_PID" || true; fi
scrape_metrics ""
python -m serve.loadtest --url "$URL" --concurrency 1 --requests 200 --max-seconds "$MAX_SECONDS" \
  --stream audio --warmup 4 "${SENTENCE_ARGS[@]}" --label "$LABEL-stream" --out "$OUT/loadtest_${LABEL}_stream.json"
