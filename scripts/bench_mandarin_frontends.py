"""Time EmotiVoice's and GPT-SoVITS's Mandarin front ends over the held-out Mandarin sentences
(``eval_zh``), with their word caches bypassed, cold (emptied, one pass) and warm, on this machine.

Both front ends cache what pypinyin gives each word (EmotiVoice: the word's symbols; GPT-SoVITS: its
readings before sandhi); the bypassed arm reads every word afresh, as they did before the caches.
Each arm is a pass over the 40 sentences; bypassed and warm take the median of ``--passes`` passes,
the arms interleaved. The 40 sentences share few words, so their cold pass says little about a server
that has run a while; for that the report adds the share of all word occurrences in jieba's frequency
dictionary that its most frequent N words make, for the caches' size and below: about the hit rate a
cache of N words reaches on text distributed like that dictionary's corpus (an LRU somewhat less).
Writes one JSON report.

    python scripts/bench_mandarin_frontends.py --out docs/results/cpu_49_mandarin_frontends.json
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jieba  # noqa: E402

from core.publishing import add_allow_dirty_argument, print_and_save_report, publication_or_exit  # noqa: E402
from models.emotivoice import mandarin as emotivoice_mandarin  # noqa: E402
from models.emotivoice.tiny import tiny_voice  # noqa: E402
from models.gpt_sovits.text import mandarin as gpt_sovits_mandarin  # noqa: E402
from models.gpt_sovits.text import pinyin_phones, tone_sandhi  # noqa: E402
from models.gpt_sovits.text.frontend import text_to_phones  # noqa: E402
from texts import load_sentences  # noqa: E402


@contextmanager
def bypassed(cached, *modules):
    """Each of ``modules`` calls ``cached``'s uncached function for the block."""
    for module in modules:
        setattr(module, cached.__name__, cached.__wrapped__)
    try:
        yield
    finally:
        for module in modules:
            setattr(module, cached.__name__, cached)


def pass_ms(read: Callable[[str], object], sentences: list[str]) -> float:
    """Milliseconds a sentence over one pass."""
    started = time.perf_counter()
    for sentence in sentences:
        read(sentence)
    return (time.perf_counter() - started) / len(sentences) * 1e3


def measure(read, cached, modules, sentences: list[str], passes: int) -> dict:
    bypassed_ms, warm_ms = [], []
    cached.cache_clear()
    cold_ms = pass_ms(read, sentences)
    words = cached.cache_info().currsize
    for _ in range(passes):
        with bypassed(cached, *modules):
            bypassed_ms.append(pass_ms(read, sentences))
        warm_ms.append(pass_ms(read, sentences))
    return {"bypassed_ms_per_sentence": statistics.median(bypassed_ms), "cold_ms_per_sentence": cold_ms,
            "warm_ms_per_sentence": statistics.median(warm_ms), "bypassed_passes_ms": bypassed_ms,
            "warm_passes_ms": warm_ms, "distinct_words": words,
            "warm_speedup": statistics.median(bypassed_ms) / statistics.median(warm_ms)}


def dictionary_coverage(sizes: list[int]) -> dict[str, float]:
    """{N: the share of word occurrences in jieba's frequency dictionary that its N most frequent words make}."""
    counts = []
    with open(os.path.join(os.path.dirname(jieba.__file__), "dict.txt"), encoding="utf-8") as dictionary:
        for line in dictionary:  # "word count part-of-speech"
            fields = line.split()
            if len(fields) >= 2:
                counts.append(int(fields[1]))
    counts.sort(reverse=True)
    total = sum(counts)
    return {str(size): sum(counts[:size]) / total for size in sizes}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    add_allow_dirty_argument(parser)
    args = parser.parse_args(argv)
    origin = publication_or_exit(parser, REPO, args.out, args.allow_dirty)
    jieba.setLogLevel(logging.WARNING)
    sentences = load_sentences("eval_zh")
    voice = tiny_voice(0)
    front_ends = {
        "emotivoice": (voice.text_to_utterances, emotivoice_mandarin.word_phonemes, (emotivoice_mandarin,)),
        "gpt_sovits_v2": (lambda sentence: text_to_phones(sentence, "zh"), pinyin_phones.dictionary_syllables,
                          (gpt_sovits_mandarin, tone_sandhi)),
    }
    for read, _, _ in front_ends.values():
        read(sentences[0])  # jieba's dictionary and pypinyin's tables load here, not inside a pass
    results = {name: measure(read, cached, modules, sentences, args.passes)
               for name, (read, cached, modules) in front_ends.items()}
    for name, result in results.items():
        print(f"{name}: bypassed {result['bypassed_ms_per_sentence']:.3f} ms a sentence, cold "
              f"{result['cold_ms_per_sentence']:.3f}, warm {result['warm_ms_per_sentence']:.3f} "
              f"({result['warm_speedup']:.1f}x)", flush=True)
    cache_size = emotivoice_mandarin.word_phonemes.cache_parameters()["maxsize"]
    coverage = dictionary_coverage([1024, 4096, 16384, cache_size])
    print("jieba's dictionary: the most frequent N words make " + ", ".join(
        f"{share:.1%} (N={size})" for size, share in coverage.items()) + " of its word occurrences", flush=True)
    report = {"tool": "scripts/bench_mandarin_frontends.py", "argv": sys.argv[1:], "provenance": origin,
              "sentence_set": "eval_zh", "sentences": len(sentences), "front_ends": results,
              "word_cache_size": cache_size, "jieba_dictionary_coverage_by_top_words": coverage}
    print_and_save_report(report, args.out)
    return report


if __name__ == "__main__":
    main()
