"""scripts/served_frontend_cost.py: EmotiVoice's tiny model on uvicorn loaded in English and in Mandarin,
the front end's time per sentence read from /metrics; Mandarin read word by word afresh must cost the
loaded server more than Mandarin read through the word cache.

    python -m pytest -q tests/serve/test_served_frontend_cost.py
"""
from __future__ import annotations

import json

from models.emotivoice import mandarin
from scripts import served_frontend_cost


def test_each_arm_reports_its_level_and_the_uncached_front_end_costs_more(tmp_path):
    cached_function = mandarin.word_phonemes
    out = tmp_path / "frontend.json"
    report = served_frontend_cost.main(["--rounds", "1", "--concurrency", "16", "--seconds", "3",
                                        "--warm-seconds", "1", "--out", str(out), "--allow-dirty"])
    assert json.loads(out.read_text()) == report
    arms = {arm["arm"]: arm for arm in report["arms"]}
    assert set(arms) == {"eval", "eval_zh", "eval_zh_uncached"}
    for arm in arms.values():
        assert arm["requests_ok"] > 0 and arm["sentences_per_s"] > 0
        assert arm["frontend_requests"] >= arm["requests_ok"]  # each answered request went through it
        assert 0 < arm["frontend_cpu_s"] <= arm["frontend_wall_s"] * 1.05
        assert 0 < arm["frontend_cpu_share_of_wall"] < 1
    uncached, cached = arms["eval_zh_uncached"], arms["eval_zh"]
    assert uncached["frontend_cpu_ms_per_sentence"] > 2 * cached["frontend_cpu_ms_per_sentence"]
    assert mandarin.word_phonemes is cached_function  # the arm without the cache put it back
