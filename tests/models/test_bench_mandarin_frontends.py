"""scripts/bench_mandarin_frontends.py: both Mandarin front ends timed with their word caches bypassed,
cold and warm; reading every word afresh must cost more than reading cached words, and the bypass must
be undone.

    python -m pytest -q tests/models/test_bench_mandarin_frontends.py
"""
from __future__ import annotations

import json

from models.emotivoice import mandarin as emotivoice_mandarin
from models.gpt_sovits.text import mandarin as gpt_sovits_mandarin
from models.gpt_sovits.text import pinyin_phones, tone_sandhi
from scripts import bench_mandarin_frontends


def test_both_front_ends_are_timed_and_their_caches_put_back(tmp_path):
    out = tmp_path / "frontends.json"
    report = bench_mandarin_frontends.main(["--passes", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert set(report["front_ends"]) == {"emotivoice", "gpt_sovits_v2"}
    for result in report["front_ends"].values():
        assert result["distinct_words"] > 100  # 40 sentences of about 15 characters
        assert result["warm_ms_per_sentence"] < result["bypassed_ms_per_sentence"]
        assert len(result["bypassed_passes_ms"]) == len(result["warm_passes_ms"]) == 2
    cached = pinyin_phones.dictionary_syllables
    assert gpt_sovits_mandarin.dictionary_syllables is cached and tone_sandhi.dictionary_syllables is cached
    assert emotivoice_mandarin.word_phonemes.__wrapped__ is not emotivoice_mandarin.word_phonemes
