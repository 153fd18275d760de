"""serve/gpu_wheels.py: the device wheel list parses, and trimming espeak-ng dictionaries keeps a
wheel pip can install."""
from __future__ import annotations

import zipfile

import pytest

from serve.gpu_wheels import requirement_lines, trim_espeak_dictionaries

DATA = "piper_phonemize/espeak-ng-data"


def _wheel(path, files: dict[str, bytes]):
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        record_path = "piper_phonemize_cross-1.2.1.dist-info/RECORD"
        wheel.writestr(record_path, record + f"{record_path},,\n")
    return path


def test_requirements_are_pinned_and_carry_the_fast_http_stack():
    lines = requirement_lines()
    assert all("==" in line and " " not in line for line in lines), lines
    names = {line.split("==")[0].lower() for line in lines}
    assert {"uvicorn", "httptools", "uvloop", "piper-phonemize-cross", "fastapi"} <= names
    assert "pygments" not in names  # rich.table does not import it: 1.2 MB the carry can spend elsewhere


def test_trim_drops_other_languages_and_their_record_lines(tmp_path):
    files = {f"{DATA}/en_dict": b"e" * 100, f"{DATA}/ru_dict": b"r" * 5000, f"{DATA}/cmn_dict": b"c" * 900,
             f"{DATA}/phondata": b"p" * 300, "piper_phonemize/__init__.py": b"# module\n"}
    wheel = _wheel(tmp_path / "piper_phonemize_cross-1.2.1-cp312-cp312-manylinux_2_28_x86_64.whl", files)
    before, after = trim_espeak_dictionaries(wheel, {"en"})
    assert after < before
    with zipfile.ZipFile(wheel) as trimmed:
        names = set(trimmed.namelist())
        record = trimmed.read("piper_phonemize_cross-1.2.1.dist-info/RECORD").decode()
        assert trimmed.read(f"{DATA}/en_dict") == files[f"{DATA}/en_dict"]
        assert trimmed.read(f"{DATA}/phondata") == files[f"{DATA}/phondata"]
    assert f"{DATA}/ru_dict" not in names and f"{DATA}/cmn_dict" not in names
    assert "ru_dict" not in record and "cmn_dict" not in record
    assert f"{DATA}/en_dict," in record and "piper_phonemize/__init__.py," in record


def test_trim_refuses_a_language_the_wheel_lacks_and_leaves_it_whole(tmp_path):
    wheel = _wheel(tmp_path / "piper_phonemize_cross-1.2.1-py3-none-any.whl", {f"{DATA}/en_dict": b"e"})
    original = wheel.read_bytes()
    with pytest.raises(ValueError, match=r"no espeak-ng dictionary for \['de'\]"):
        trim_espeak_dictionaries(wheel, {"en", "de"})
    assert wheel.read_bytes() == original
