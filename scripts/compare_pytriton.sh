#!/usr/bin/env bash
# The same load against our runtime and against PyTriton, one after the other on this machine, with
# the same variant, batch size, batching delay and onnxruntime threads, so the two are comparable.
#   bash scripts/compare_pytriton.sh          -> outputs/loadtest/compare_{runtime,pytriton}.json
# Needs the project's venv (scripts/setup_env.sh) and .venv-pytriton (bash scripts/pytriton_env.sh).
# Settings (environment): CONCURRENCY (1,8), REQUESTS per level (80), MAX_BATCH (8),
# MAX_WAIT_MS (10), THREADS (2), VARIANT (original_onnx).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || source scripts/setup_env.sh  # an active venv is used as it is
[ -x .venv-pytriton/bin/python ] || { echo "no .venv-pytriton: run bash scripts/pytriton_env.sh first" >&2; exit 2; }
CONCURRENCY=${CONCURRENCY:-1,8}
REQUESTS=${REQUESTS:-80}
MAX_BATCH=${MAX_BATCH:-8}
MAX_WAIT_MS=${MAX_WAIT_MS:-10}
THREADS=${THREADS:-2}
VARIANT=${VARIANT:-original_onnx}
OUT=outputs/loadtest
mkdir -p "$OUT"
CLIENT=(--concurrency "$CONCURRENCY" --requests "$REQUESTS" --max-seconds 60 --warmup 4 --ready-timeout-s 180)

python -m serve serve.source="$VARIANT" serve.port=8020 serve.threads="$THREADS" serve.max_batch_size="$MAX_BATCH" \
  serve.max_wait_ms="$MAX_WAIT_MS" serve.access_log=false hydra.run.dir="$OUT/compare_hydra" \
  >"$OUT/compare_runtime_server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
python -m serve.loadtest --url http://127.0.0.1:8020 "${CLIENT[@]}" --label runtime --out "$OUT/compare_runtime.json"
kill -TERM $server; wait $server || true

.venv-pytriton/bin/python -m serve.pytriton_server --variant "$VARIANT" --http-port 8021 --grpc-port 8022 \
  --metrics-port 8023 --max-batch-size "$MAX_BATCH" --max-queue-delay-us $((MAX_WAIT_MS * 1000)) \
  --threads "$THREADS" >"$OUT/compare_pytriton_server.log" 2>&1 &
server=$!
.venv-pytriton/bin/python -m serve.loadtest --triton --url http://127.0.0.1:8021 "${CLIENT[@]}" --label pytriton \
  --out "$OUT/compare_pytriton.json"
