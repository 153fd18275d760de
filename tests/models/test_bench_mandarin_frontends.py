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
    emotivoice_cached, gpt_sovits_cached = emotivoice_mandarin.word_phonemes, pinyin_phones.dictionary_syllables
    out = tmp_path / "frontends.json"
    report = bench_mandarin_frontends.main(["--passes", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert set(report["front_ends"]) == {"emotivoice", "gpt_sovits_v2"}
    for result in report["front_ends"].values():
        assert result["distinct_words"] > 100  # 40 sentences of about 15 characters
        assert len(result["bypassed_passes_ms"]) == len(result["warm_passes_ms"]) == 2
    coverage = [report["jieba_dictionary_coverage_by_top_words"][size] for size in ("1024", "4096", "16384")]
    coverage.append(report["jieba_dictionary_coverage_by_top_words"][str(report["word_cache_size"])])
    assert 0 < coverage[0] < coverage[1] < coverage[2] < coverage[3] <= 1
    emotivoice = report["front_ends"]["emotivoice"]  # about 5x apart on an idle CPU: room for a loaded one
    assert emotivoice["warm_ms_per_sentence"] < emotivoice["bypassed_ms_per_sentence"]
    assert emotivoice_mandarin.word_phonemes is emotivoice_cached
    assert gpt_sovits_mandarin.dictionary_syllables is gpt_sovits_cached
    assert tone_sandhi.dictionary_syllables is gpt_sovits_cached
    assert pinyin_phones.dictionary_syllables is gpt_sovits_cached
