#!/usr/bin/env bash
# Memory soak of the serving runtime: steady load for SOAK_SECONDS (default 600) while the
# server's resident memory is sampled every 15 s.
#   bash scripts/soak.sh [extra serve overrides]      -> outputs/loadtest/soak_rss.csv, soak.json
# Pass: RSS at the end within 10 % of RSS after warm-up.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${VIRTUAL_ENV:-}" ] || source scripts/setup_env.sh  # an active venv is used as it is
SOAK_SECONDS=${SOAK_SECONDS:-600}
PORT=${PORT:-8011}
mkdir -p outputs/loadtest
python -m serve serve.port="$PORT" serve.threads=2 "$@" > outputs/loadtest/soak_server.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null && break; sleep 1; done
echo "seconds,rss_mib" > outputs/loadtest/soak_rss.csv
(
  start=$(date +%s)
  while kill -0 "$server" 2>/dev/null; do
    rss_kib=$(awk '/VmRSS/ {print $2}' "/proc/$server/status")
    echo "$(( $(date +%s) - start )),$(( rss_kib / 1024 ))" >> outputs/loadtest/soak_rss.csv
    sleep 15
  done
) &
sampler=$!
python -m serve.loadtest --url "http://127.0.0.1:$PORT" --concurrency 4 --requests 1000000 \
    --max-seconds "$SOAK_SECONDS" --label soak --out outputs/loadtest/soak.json
kill $sampler 2>/dev/null || true
python - <<'PY'
import csv
rows = list(csv.DictReader(open("outputs/loadtest/soak_rss.csv")))
first, last = int(rows[1]["rss_mib"]), int(rows[-1]["rss_mib"])  # rows[0]: just after warm-up
print(f"RSS {first} MiB -> {last} MiB over {rows[-1]['seconds']} s: {100 * (last - first) / first:+.1f} %")
PY
