r"""Fetch the wheels serve/gpu_loadtest.sh installs on a GPU machine (Python 3.12, no index) into one
carried folder, small enough to travel beside the converted voice:

    python -m serve.gpu_wheels --out .whl312

What it does: ``pip download`` of serve/gpu_wheels.txt for cp312/manylinux x86_64; a local build
of the wheels PyPI has only as sdists (antlr4, pure Python); then it trims piper-phonemize-cross,
whose espeak-ng data holds pronunciation dictionaries for about 100 languages (the Russian one
alone is 4.8 MB compressed), down to the dictionaries named by ``--keep-dicts``. The device
carries 64 MiB per call, and this trim is what makes room for uvloop, httptools and py-spy.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REQUIREMENTS = Path(__file__).with_name("gpu_wheels.txt")
SDIST_ONLY = ("antlr4-python3-runtime",)  # no wheel on PyPI: built here, pure Python, so any interpreter takes it
PLATFORM_ARGS = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                 "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_5_x86_64",
                 "--platform", "manylinux1_x86_64"]
ESPEAK_DICT = re.compile(r"^piper_phonemize/espeak-ng-data/(?P<language>[a-z_]+)_dict$")


def requirement_lines(path: Path = REQUIREMENTS) -> list[str]:
    """The pinned requirements of ``path`` ('name==version'), comments and blank lines dropped."""
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            lines.append(line)
    return lines


def trim_espeak_dictionaries(wheel: Path, keep: set[str]) -> tuple[int, int]:
    """Rewrite ``wheel`` in place without the espeak-ng ``<language>_dict`` files not in ``keep``.

    RECORD loses the dropped files' lines, so pip installs the trimmed wheel as it would the
    original. Returns (bytes before, bytes after)."""
    before = wheel.stat().st_size
    dropped: set[str] = set()
    with zipfile.ZipFile(wheel) as source:
        names = source.namelist()
        for name in names:
            match = ESPEAK_DICT.match(name)
            if match and match["language"] not in keep:
                dropped.add(name)
        missing = keep - {m["language"] for m in map(ESPEAK_DICT.match, names) if m}
        if missing:
            raise ValueError(f"{wheel.name} has no espeak-ng dictionary for {sorted(missing)}")
        partial = wheel.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():
                if info.filename in dropped:
                    continue
                data = source.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(line for line in lines if line.split(",", 1)[0] not in dropped).encode()
                target.writestr(info, data)
    partial.replace(wheel)  # atomic: an interrupted trim leaves the original wheel
    return before, wheel.stat().st_size


def fetch(out: Path, keep_dicts: set[str]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    lines = requirement_lines()
    binary = [line for line in lines if not line.startswith(SDIST_ONLY)]
    sdists = [line for line in lines if line.startswith(SDIST_ONLY)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
        listing.write("\n".join(binary) + "\n")
        listing.flush()
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        *PLATFORM_ARGS, "-d", str(out), "-r", listing.name], check=True)
    if sdists:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), *sdists], check=True)
    for wheel in out.glob("piper_phonemize*.whl"):
        before, after = trim_espeak_dictionaries(wheel, keep_dicts)
        print(f"{wheel.name}: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB (espeak-ng dictionaries kept: "
              f"{', '.join(sorted(keep_dicts))})")
    wheels = sorted(out.glob("*.whl"))
    print(f"{len(wheels)} wheels in {out}: {sum(w.stat().st_size for w in wheels) / 2**20:.1f} MiB")
    return wheels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".whl312"), help="the carried folder (git-ignored)")
    parser.add_argument("--keep-dicts", default="en",
                        help="comma-separated espeak-ng languages whose dictionaries stay (the served voices' own)")
    args = parser.parse_args(argv)
    fetch(args.out, {language.strip() for language in args.keep_dicts.split(",") if language.strip()})


if __name__ == "__main__":
    main()
