#!/usr/bin/env bash
# One chunk of the Lite student's adversarial distillation, on the GPU machine (issue: the CPU champion).
#   bash scripts/train_lite_gan_chunk.sh CHUNK_NAME MAX_SECONDS       # FRESH_RUN=1: the run's first chunk
# Every chunk of the run uses these settings: the learning-rate schedule spans all 60,000 steps and a
# batch is a function of the step, so chunks resume where the last one stopped and the run equals an
# uninterrupted one. The run's state lives in .device/gan/run/state (safetensors shards under 16 MiB);
# each chunk copies it, its log and the eval audio of the step it reached into $OUT. Here, the eval
# audio is scored with:  python -m compress.training_curve --eval-dir .device/gan/run --run-name lite_gan
#
# The teacher bundle (python -m compress.distil prepare --family piper --voice bundled:joe --out .device/gan/bundle)
# and the state are too large to travel in one call (64 MiB): a session's first call carries
# .device/gan/bundle, the next (back to back, on the warm machine) carries .device/gan/run/state.
# .device/ does not outlive the machine this checkout is on: after a session's last chunk, copy the
# state to models/checkpoints/lite_gan_state/ and commit it; at the next session's start, move it back
# into .device/gan/run/state and git rm it, so that the tracked tree stays small enough to travel.
set -euo pipefail
chunk=${1:?chunk name, e.g. chunk04}
max_seconds=${2:?seconds of training in this call}
export PYTHONUNBUFFERED=1
test -f .device/gan/bundle/teacher.safetensors || { echo "no .device/gan/bundle: carry it first" >&2; exit 3; }
# Without its state a chunk would start the run over from the spectral student, silently.
if ! compgen -G ".device/gan/run/state/state-*.safetensors" >/dev/null && [ "${FRESH_RUN:-0}" != 1 ]; then
  echo "no run state in .device/gan/run/state: carry it (models/checkpoints/README.md), or FRESH_RUN=1 to start over" >&2
  exit 3
fi
python3 -m models.piper.training.lite_training train --bundle .device/gan/bundle --checkpoint .device/gan/run/state \
    --init models/checkpoints/lite_joe_medium.safetensors --steps 60000 --lr 2e-4 --warmup-steps 200 \
    --final-lr-fraction 0.05 --batch-size 32 --segment-frames 32 --latent-weight 10 --gan --mel-weight 45 \
    --stft-weight 1 --discriminator-warmup-steps 1000 --max-seconds "$max_seconds" --device cuda --log-every 250 \
    --eval-out .device/gan/run 2>&1 | tee "$OUT/$chunk.log"
mkdir -p "$OUT/state"
cp .device/gan/run/state/* "$OUT/state/"
cp "$(ls .device/gan/run/eval_step*.npz | tail -1)" "$OUT/"
