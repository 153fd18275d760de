"""Intelligibility as word error rate: pocketsphinx transcribes the audio, edit distance to the text.

pocketsphinx's general English language model misrecognises about 0.30 of the words of clean
synthesized speech, which leaves little room to see a compressed voice get worse. The recognizer here
is fitted to the evaluation set instead: a trigram language model written from the very
sentences being evaluated, and a pronunciation dictionary holding only their words. The
acoustic model then decides between a few plausible word sequences, and errors come from the
audio, not from the language model's ignorance.

Pronunciations come from pocketsphinx's bundled CMUdict; a word it lacks (names, rare plurals)
gets the pronunciation espeak-ng gives it, mapped to CMUdict phones; that is the frontend the
espeak-based voices speak from. Words neither can pronounce are listed in
``DomainRecognizer.out_of_vocabulary_words``: they cannot be recognised, so each one counts as
an error for every voice alike.

Corpus WER of the bundled joe voice as it ships (its original ONNX graph, default noise scales),
clean and with white noise at 20/10/0 dB SNR:

    ==========================  ==========================  =====  =====  =====  =====
    audio                       language model              clean  20 dB  10 dB  0 dB
    ==========================  ==========================  =====  =====  =====  =====
    first 20 Harvard sentences  general English              0.31   0.50   0.87   0.96
    first 20 Harvard sentences  domain, from those 20        0.00   0.03   0.21   0.85
    first 20 Harvard sentences  domain, from all 360         0.02   0.03   0.36   0.89
    texts/eval_sentences.txt    general English              0.24   --     0.79   --
    texts/eval_sentences.txt    domain, from the eval set    0.01   --     0.18   --
    ==========================  ==========================  =====  =====  =====  =====

Usage::

    from evaluate.intelligibility import DomainRecognizer, WordErrorRate, normalize_text

    recognizer = DomainRecognizer.from_sentences(sentences)   # the sentences being evaluated
    recognizer.transcribe(waveform, sample_rate_hz=22050)      # -> "the birch canoe slid ..."
    recognizer.out_of_vocabulary_words                         # -> frozenset of unpronounceable words

    wer = WordErrorRate(recognizer)
    for waveform, text in zip(waveforms, sentences):          # each waveform (T,) float
        wer.update(waveform, sample_rate_hz=22050, reference_text=text)
    wer.compute()                                             # -> tensor, corpus WER (errors / reference words)

    DomainRecognizer.general_english()                        # the bundled general LM, for comparison only
"""
from __future__ import annotations

import logging
import math
import re
import tempfile
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import librosa
import numpy as np
import pocketsphinx
import torch
from torchmetrics.text import WordErrorRate as _CorpusWordErrorRate

from evaluate.audio_input import mono_float32
from models.text.espeak_frontend import espeak_ipa

RECOGNIZER_SAMPLE_RATE_HZ = 16000  # the bundled en-us acoustic model is a 16 kHz model
TRIGRAM_DISCOUNT = 0.5  # absolute discount per seen n-gram; the freed mass backs off to shorter histories
_MODEL_DIR = Path(pocketsphinx.get_model_path()) / "en-us"
_CMUDICT_PATH = _MODEL_DIR / "cmudict-en-us.dict"
_ESPEAK_VOICE = "en-us"
_LOG = logging.getLogger(__name__)

# espeak-ng IPA -> CMUdict phones. Longest symbols are matched first.
_IPA_TO_CMU = {
    "tʃ": "CH", "dʒ": "JH", "eɪ": "EY", "aɪ": "AY", "ɔɪ": "OY", "aʊ": "AW", "oʊ": "OW", "oː": "AO",
    "ɪ": "IH", "ᵻ": "IH", "i": "IY", "ɛ": "EH", "e": "EY", "æ": "AE", "a": "AE", "ə": "AH", "ɐ": "AH",
    "ʌ": "AH", "ɚ": "ER", "ɜ": "ER", "ɑ": "AA", "ɒ": "AA", "ɔ": "AO", "o": "OW", "ʊ": "UH", "u": "UW",
    "p": "P", "b": "B", "t": "T", "d": "D", "k": "K", "ɡ": "G", "g": "G", "f": "F", "v": "V",
    "θ": "TH", "ð": "DH", "s": "S", "z": "Z", "ʃ": "SH", "ʒ": "ZH", "h": "HH", "m": "M", "n": "N",
    "ŋ": "NG", "l": "L", "ɬ": "L", "ɹ": "R", "r": "R", "j": "Y", "w": "W",
    "ɾ": "T", "ʔ": "T", "x": "K",  # flap, glottal stop, velar fricative: CMUdict writes these as T, T, K
}
# Stress, length, syllabicity and nasalisation marks carry no CMUdict phone.
_IPA_IGNORED = {"ˈ", "ˌ", "ː", "\u0329", "\u0303", " "}

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
         "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = [(10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred")]
_IRREGULAR_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                       "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
_NUMBER = re.compile(r"(\d[\d,]*)(?:\.(\d+))?(?:(st|nd|rd|th)\b)?")


def _cardinal_words(number: int) -> list[str]:
    """English words for a non-negative integer: 2024 -> two thousand twenty four."""
    if number < 20:
        return [_ONES[number]]
    for scale, name in _SCALES:
        if number >= scale:
            rest = number % scale
            return _cardinal_words(number // scale) + [name] + (_cardinal_words(rest) if rest else [])
    return [_TENS[number // 10]] + ([_ONES[number % 10]] if number % 10 else [])


def _spell_number(match: re.Match) -> str:
    integer_part, fraction_part, ordinal_suffix = match.groups()
    words = _cardinal_words(int(integer_part.replace(",", "")))
    if fraction_part:
        words += ["point"] + [_ONES[int(digit)] for digit in fraction_part]
    elif ordinal_suffix:
        last = words[-1]
        words[-1] = _IRREGULAR_ORDINALS.get(last) or (last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return f" {' '.join(words)} "


def normalize_text(text: str) -> str:
    """Lowercase words as a recognizer writes them: numbers spelled out, punctuation and hyphens gone.

    Apostrophes inside words stay ("it's", "man's"): CMUdict spells contractions and possessives so.
    """
    text = _NUMBER.sub(_spell_number, text.lower())
    text = re.sub(r"[^a-z']+", " ", text)
    words = (word.strip("'") for word in text.split())
    return " ".join(word for word in words if word)


def _read_cmudict() -> dict[str, list[str]]:
    """Word -> its pronunciations (phone strings), alternatives ``word(2)`` folded under ``word``."""
    pronunciations: dict[str, list[str]] = defaultdict(list)
    with open(_CMUDICT_PATH, encoding="utf-8") as lines:
        for line in lines:
            entry, _, phones = line.strip().partition(" ")
            pronunciations[re.sub(r"\(\d+\)$", "", entry)].append(phones.strip())
    return pronunciations


def _espeak_pronunciation(word: str) -> str | None:
    """CMUdict phones for ``word`` from espeak-ng's IPA, or None when a symbol has no mapping."""
    ipa = "".join("".join(clause) for clause in espeak_ipa(word, _ESPEAK_VOICE))
    phones, position = [], 0
    while position < len(ipa):
        if ipa[position] in _IPA_IGNORED:
            position += 1
            continue
        for length in (2, 1):
            symbol = ipa[position: position + length]
            if symbol in _IPA_TO_CMU:
                phones.append(_IPA_TO_CMU[symbol])
                position += length
                break
        else:
            return None
    return " ".join(phones) if phones else None


def _arpa_trigram(sentences: Sequence[list[str]], discount: float) -> str:
    """A backoff trigram LM in ARPA format over the given word lists.

    Unigrams are add-one smoothed over the vocabulary; each seen bigram and trigram loses
    ``discount`` of its count, and that mass is spread over the shorter history's distribution
    through the backoff weight, so any word order the vocabulary allows stays possible.
    """
    counts: list[Counter] = [Counter(), Counter(), Counter()]  # counts[n - 1][n-gram tuple]
    for words in sentences:
        tokens = ["<s>", *words, "</s>"]
        for order in (1, 2, 3):
            for start in range(len(tokens) - order + 1):
                counts[order - 1][tuple(tokens[start: start + order])] += 1
    del counts[0][("<s>",)]  # a sentence start is given, never predicted

    num_tokens = sum(counts[0].values())
    vocabulary_size = len(counts[0])
    probabilities: list[dict[tuple, float]] = [
        {unigram: (count + 1) / (num_tokens + vocabulary_size) for unigram, count in counts[0].items()}, {}, {}
    ]
    backoff_weights: dict[tuple, float] = {}

    def probability(ngram: tuple) -> float:
        if ngram in probabilities[len(ngram) - 1]:
            return probabilities[len(ngram) - 1][ngram]
        return backoff_weights.get(ngram[:-1], 1.0) * probability(ngram[1:])

    for order in (2, 3):
        followers: dict[tuple, dict[str, int]] = defaultdict(dict)
        for ngram, count in counts[order - 1].items():
            followers[ngram[:-1]][ngram[-1]] = count
        for history, next_counts in followers.items():
            history_count = sum(next_counts.values())
            lower_mass = sum(probability(history[1:] + (word,)) for word in next_counts)
            for word, count in next_counts.items():
                probabilities[order - 1][history + (word,)] = (count - discount) / history_count
            if lower_mass < 1.0:  # else every vocabulary word already follows: nothing to back off to
                backoff_weights[history] = discount * len(next_counts) / history_count / (1.0 - lower_mass)

    lines = ["\\data\\"] + [f"ngram {order}={len(counts[order - 1]) + (order == 1)}" for order in (1, 2, 3)]
    for order in (1, 2, 3):
        lines += ["", f"\\{order}-grams:"]
        if order == 1:
            lines.append(f"-99.000000 <s> {math.log10(backoff_weights.get(('<s>',), 1.0)):.6f}")
        for ngram, prob in sorted(probabilities[order - 1].items()):
            line = f"{math.log10(prob):.6f} {' '.join(ngram)}"
            if order < 3 and ngram in backoff_weights:
                line += f" {math.log10(backoff_weights[ngram]):.6f}"
            lines.append(line)
    lines += ["", "\\end\\", ""]
    return "\n".join(lines)


def _to_pcm16(waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> bytes:
    """Check a mono waveform and return it as 16 kHz 16-bit PCM bytes, the recognizer's input."""
    audio = mono_float32(waveform, sample_rate_hz=sample_rate_hz)
    if sample_rate_hz != RECOGNIZER_SAMPLE_RATE_HZ:
        audio = librosa.resample(audio, orig_sr=sample_rate_hz, target_sr=RECOGNIZER_SAMPLE_RATE_HZ)
    return (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16).tobytes()


class DomainRecognizer:
    """pocketsphinx with a language model and dictionary built for one sentence set."""

    def __init__(
        self,
        decoder: pocketsphinx.Decoder,
        vocabulary: frozenset[str] | None,
        out_of_vocabulary_words: frozenset[str] = frozenset(),
        espeak_pronounced_words: frozenset[str] = frozenset(),
    ):
        self.decoder = decoder
        self.vocabulary = vocabulary  # None: the general LM, which can write any CMUdict word
        self.out_of_vocabulary_words = out_of_vocabulary_words
        self.espeak_pronounced_words = espeak_pronounced_words

    @classmethod
    def from_sentences(cls, sentences: Sequence[str], discount: float = TRIGRAM_DISCOUNT) -> "DomainRecognizer":
        """Fit the language model and dictionary to ``sentences``, the texts that will be evaluated."""
        if isinstance(sentences, str) or not sentences:
            raise ValueError("sentences must be a non-empty list of texts, e.g. the evaluation sentences")
        if not 0 < discount < 1:
            raise ValueError(f"discount must lie strictly between 0 and 1, got {discount}")
        sentence_words = [normalize_text(sentence).split() for sentence in sentences]
        cmudict = _read_cmudict()
        dictionary_lines, espeak_words, unpronounceable = [], set(), set()
        for word in sorted({word for words in sentence_words for word in words}):
            pronunciations = cmudict.get(word)
            if pronunciations is None:
                espeak_phones = _espeak_pronunciation(word)
                if espeak_phones is None:
                    unpronounceable.add(word)
                    continue
                espeak_words.add(word)
                pronunciations = [espeak_phones]
            # CMUdict's own convention for alternatives: word, word(2), word(3), ...
            entries = [word] + [f"{word}({number})" for number in range(2, len(pronunciations) + 1)]
            dictionary_lines += [f"{entry} {phones}" for entry, phones in zip(entries, pronunciations)]
        if espeak_words:
            _LOG.info("pronounced by espeak-ng (not in CMUdict): %s", ", ".join(sorted(espeak_words)))
        if unpronounceable:
            _LOG.warning(
                "no pronunciation, cannot be recognised, counted as errors: %s", ", ".join(sorted(unpronounceable))
            )
        known_words = [[word for word in words if word not in unpronounceable] for words in sentence_words]
        if not any(known_words):
            raise ValueError(f"no word of the {len(sentences)} sentences can be pronounced: nothing to recognise")
        with tempfile.TemporaryDirectory() as directory:
            dictionary_path, lm_path = Path(directory) / "domain.dict", Path(directory) / "domain.arpa"
            dictionary_path.write_text("\n".join(dictionary_lines) + "\n", encoding="utf-8")
            lm_path.write_text(_arpa_trigram(known_words, discount), encoding="utf-8")
            decoder = pocketsphinx.Decoder(
                lm=str(lm_path), dict=str(dictionary_path), samprate=RECOGNIZER_SAMPLE_RATE_HZ, loglevel="FATAL"
            )
        vocabulary = frozenset(word for words in known_words for word in words)
        return cls(decoder, vocabulary, frozenset(unpronounceable), frozenset(espeak_words))

    @classmethod
    def general_english(cls) -> "DomainRecognizer":
        """pocketsphinx's bundled general English LM and full CMUdict: the weak baseline."""
        return cls(pocketsphinx.Decoder(samprate=RECOGNIZER_SAMPLE_RATE_HZ, loglevel="FATAL"), vocabulary=None)

    def transcribe(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int) -> str:
        """The recognised words of one utterance (T,), normalised like reference texts."""
        pcm = _to_pcm16(waveform, sample_rate_hz)  # checked before an utterance is opened
        self.decoder.start_utt()
        self.decoder.process_raw(pcm, full_utt=True)
        self.decoder.end_utt()
        hypothesis = self.decoder.hyp()
        return normalize_text(hypothesis.hypstr) if hypothesis is not None else ""


class WordErrorRate(_CorpusWordErrorRate):
    """Corpus WER (all word errors / all reference words) of recognised speech against its text."""

    def __init__(self, recognizer, **kwargs):
        """``recognizer``: anything with ``transcribe(waveform, sample_rate_hz) -> str`` (a
        DomainRecognizer, evaluate.asr.WhisperRecognizer); both sides are normalized alike."""
        super().__init__(**kwargs)
        self.recognizer = recognizer

    def update(self, waveform: torch.Tensor | np.ndarray, sample_rate_hz: int, reference_text: str) -> None:
        reference = normalize_text(reference_text)
        if not reference:
            raise ValueError(
                f"reference_text {reference_text!r} has no words after normalisation: give the spoken text"
            )
        vocabulary = getattr(self.recognizer, "vocabulary", None)  # a closed-vocabulary recognizer's words
        if vocabulary is not None:
            unknown = set(reference.split()) - vocabulary - self.recognizer.out_of_vocabulary_words
            if unknown:
                raise ValueError(
                    f"reference_text {reference_text!r} has words {sorted(unknown)} the recognizer was not built "
                    "with: build it with DomainRecognizer.from_sentences on the sentences being evaluated"
                )
        super().update(normalize_text(self.recognizer.transcribe(waveform, sample_rate_hz)), reference)
