"""Mandarin tone sandhi on segmented words, the rules of the v2 front end.

A word is given with its part-of-speech tag (jieba's) and one tone per character ("1"-"5", 5 neutral;
None for a punctuation mark inside a merged word). The rules, applied in this order:

* 不: bu4 -> bu2 before a fourth tone (不怕); neutral in the middle of a three-character word (看不懂).
* 一: kept in digit strings (一零一); neutral between a reduplicated verb (看一看); yi1 as an ordinal
  (第一); otherwise yi2 before a fourth tone (一段) and yi4 before the others (一天).
* neutral tone: reduplicated nouns, verbs and adjectives (奶奶, 试试), sentence particles (吧 呢 啊...),
  的/地/得, the aspect markers 了/着/过, -们/-子 nouns, 上/下/里 locatives, directional 来/去 (上来),
  the measure word 个 after a number (一个 -> yi2 ge5), and the words of a fixed list.
* third tone: 3-3 -> 2-3 inside a two-character word (你好 -> ni2 hao3); three-character words by
  their internal split (蒙古/包 -> 2-2-3, 纸/老虎 -> 3-2-3); four-character words as two pairs.

Before the rules run, jieba's words are merged where the rules need the context: 不 and 一 with the
word after them, "V 一 V", reduplications, and neighbouring third-tone words (2-3 characters at most).
"""
from __future__ import annotations

import functools
from pathlib import Path

import jieba

from models.gpt_sovits.text.pinyin_phones import dictionary_syllables

_WORD_LISTS_PATH = Path(__file__).with_name("mandarin_word_lists.txt")
_PARTICLES = "吧呢哈啊呐噻嘛吖嗨呐哦哒额滴哩哟喽啰耶喔诶"
_STRUCTURAL_PARTICLES = "的地得"
_ASPECT_MARKERS = "了着过"
_ASPECT_TAGS = {"ul", "uz", "ug"}
_LOCATIVES = "上下里"
_LOCATIVE_TAGS = {"s", "l", "f"}
_DIRECTIONAL_VERBS = "上下进出回过起开"
_GE_QUANTIFIERS = "几有两半多各整每做是"  # 个 after these (or a numeral) is a measure word
_SENTENCE_MARKS = "：，；。？！“”‘’':,;.?!"

Tones = list  # list[str | None], one per character of the word


@functools.cache
def word_lists() -> dict[str, frozenset[str]]:
    """The lexical lists in ``mandarin_word_lists.txt``, by section name."""
    lists: dict[str, set[str]] = {}
    section = None
    for line in _WORD_LISTS_PATH.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            lists[section] = set()
        elif section is None:
            raise ValueError(f"{_WORD_LISTS_PATH}: words before any [section]: {line[:40]!r}")
        else:
            lists[section].update(line.split())
    return {name: frozenset(words) for name, words in lists.items()}


def dictionary_tones(word: str) -> Tones:
    """pypinyin's tone per character, before sandhi (None for a character without a reading)."""
    return [syllable[-1] if syllable else None for syllable in dictionary_syllables(word)]


def merge_for_sandhi(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """jieba's (word, tag) pairs, merged where a sandhi rule needs two words together."""
    words = _merge_bu(words)
    words = _merge_yi(words)
    words = _merge_reduplication(words)
    words = _merge_third_tones(words, _whole_words_third_tone)
    words = _merge_third_tones(words, _boundary_third_tone)
    return _merge_er(words)


def apply_sandhi(word: str, tag: str, tones: Tones) -> Tones:
    """The spoken tones of ``word`` from its dictionary ``tones``."""
    tones = list(tones)
    tones = _bu_sandhi(word, tones)
    tones = _yi_sandhi(word, tones)
    tones = _neutral_sandhi(word, tag, tones)
    return _third_tone_sandhi(word, tones)


def _bu_sandhi(word: str, tones: Tones) -> Tones:
    if len(word) == 3 and word[1] == "不":
        tones[1] = "5"
        return tones
    for index, char in enumerate(word[:-1]):
        if char == "不" and tones[index + 1] == "4":
            tones[index] = "2"
    return tones


def _yi_sandhi(word: str, tones: Tones) -> Tones:
    if "一" in word and all(char.isnumeric() for char in word if char != "一"):
        return tones
    if len(word) == 3 and word[1] == "一" and word[0] == word[2]:
        tones[1] = "5"
    elif word.startswith("第一"):
        tones[1] = "1"
    else:
        for index, char in enumerate(word[:-1]):
            if char != "一":
                continue
            if tones[index + 1] == "4":
                tones[index] = "2"
            elif word[index + 1] not in _SENTENCE_MARKS:
                tones[index] = "4"
    return tones


def _neutral_sandhi(word: str, tag: str, tones: Tones) -> Tones:
    lists = word_lists()
    never_neutral = lists["never_neutral_tone_words"]
    neutral = lists["neutral_tone_words"]
    for index in range(1, len(word)):
        if word[index] == word[index - 1] and tag[:1] in ("n", "v", "a") and word not in never_neutral:
            tones[index] = "5"
    ge_index = word.find("个")
    if _has_neutral_suffix(word, tag, never_neutral):
        tones[-1] = "5"
    elif word == "个" or (ge_index >= 1 and (word[ge_index - 1].isnumeric() or word[ge_index - 1] in _GE_QUANTIFIERS)):
        tones[ge_index] = "5"
    elif word in neutral or word[-2:] in neutral:
        tones[-1] = "5"
    # Either half of a longer word may itself be a listed neutral-tone word (老实人 -> 老实/人).
    start = 0
    for part in split_in_two(word):
        if part and (part in neutral or part[-2:] in neutral):
            tones[start + len(part) - 1] = "5"
        start += len(part)
    return tones


def _has_neutral_suffix(word: str, tag: str, never_neutral: frozenset[str]) -> bool:
    """Whether the last character is a grammatical suffix read in the neutral tone."""
    last = word[-1]
    if last in _PARTICLES or last in _STRUCTURAL_PARTICLES:
        return True
    if len(word) == 1:
        return word in _ASPECT_MARKERS and tag in _ASPECT_TAGS  # 走了, 看着, 去过
    if last in "们子" and tag in ("r", "n") and word not in never_neutral:
        return True
    if last in _LOCATIVES and tag in _LOCATIVE_TAGS:  # 桌上, 家里
        return True
    return last in "来去" and word[-2] in _DIRECTIONAL_VERBS  # 上来, 下去


def _third_tone_sandhi(word: str, tones: Tones) -> Tones:
    if len(word) == 2 and _all_third(tones):
        tones[0] = "2"
    elif len(word) == 3:
        first, _ = split_in_two(word)
        if _all_third(tones):
            if len(first) == 2:  # 蒙古/包
                tones[0] = tones[1] = "2"
            else:  # 纸/老虎
                tones[1] = "2"
        else:
            halves = [tones[: len(first)], tones[len(first):]]
            for index, half in enumerate(halves):
                if len(half) == 2 and _all_third(half):  # 所有/人
                    half[0] = "2"
                elif index == 1 and not _all_third(half) and half[0] == "3" and halves[0][-1] == "3":  # 好/喜欢
                    halves[0][-1] = "2"
            tones = halves[0] + halves[1]
    elif len(word) == 4:  # an idiom reads as two pairs
        for start in (0, 2):
            if _all_third(tones[start:start + 2]):
                tones[start] = "2"
    return tones


def split_in_two(word: str) -> tuple[str, str]:
    """``word`` split at its shortest jieba sub-word: 纸老虎 -> 纸/老虎, 蒙古包 -> 蒙古/包."""
    shortest = min(jieba.cut_for_search(word), key=len)
    if word.startswith(shortest):
        return shortest, word[len(shortest):]
    return word[: -len(shortest)], shortest


def _all_third(tones: Tones) -> bool:
    return all(tone == "3" for tone in tones)


def _merge_bu(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    pending_bu = False
    for word, tag in words:
        if pending_bu:
            word = "不" + word
        pending_bu = word == "不"
        if not pending_bu:
            merged.append((word, tag))
    if pending_bu:
        merged.append(("不", "d"))
    return merged


def _merge_yi(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # "V 一 V" (听一听) becomes one word first, so that 一 turns neutral there.
    merged: list[tuple[str, str]] = []
    index = 0
    while index < len(words):
        word, tag = words[index]
        if word == "一" and merged and index + 1 < len(words):
            before, after = merged[-1], words[index + 1]
            if before[0] == after[0] and before[1] == "v" and after[1] == "v":
                merged[-1] = (before[0] + "一" + after[0], before[1])
                index += 2
                continue
        merged.append((word, tag))
        index += 1
    # Then a lone 一 takes the word after it.
    joined: list[tuple[str, str]] = []
    for word, tag in merged:
        if joined and joined[-1][0] == "一":
            joined[-1] = ("一" + word, joined[-1][1])
        else:
            joined.append((word, tag))
    return joined


def _merge_reduplication(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    for word, tag in words:
        if merged and merged[-1][0] == word:
            merged[-1] = (word + word, merged[-1][1])
        else:
            merged.append((word, tag))
    return merged


def _whole_words_third_tone(left: Tones, right: Tones) -> bool:
    return _all_third(left) and _all_third(right)


def _boundary_third_tone(left: Tones, right: Tones) -> bool:
    return bool(left) and bool(right) and left[-1] == "3" and right[0] == "3"


def _merge_third_tones(words: list[tuple[str, str]], joins) -> list[tuple[str, str]]:
    """Join a word to the one before when ``joins`` their tones, up to three characters in all."""
    tones = [dictionary_tones(word) for word, _ in words]
    merged: list[tuple[str, str]] = []
    previous_was_joined = False
    for index, (word, tag) in enumerate(words):
        joined = False
        if index > 0 and not previous_was_joined and joins(tones[index - 1], tones[index]):
            before = words[index - 1][0]
            reduplicated = len(before) == 2 and before[0] == before[1]
            if not reduplicated and len(before) + len(word) <= 3:
                merged[-1] = (merged[-1][0] + word, merged[-1][1])
                joined = True
        if not joined:
            merged.append((word, tag))
        previous_was_joined = joined
    return merged


def _merge_er(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: list[tuple[str, str]] = []
    for word, tag in words:
        if word == "儿" and merged and merged[-1][0] != "#":
            merged[-1] = (merged[-1][0] + word, merged[-1][1])
        else:
            merged.append((word, tag))
    return merged
