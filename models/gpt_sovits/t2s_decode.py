"""Eager decoding of the GPT-SoVITS v2 text-to-semantic model, following the official rules.

    from models.gpt_sovits.t2s_decode import decode, max_tokens_for_early_stop
    sampling = AutoregressiveSampling(top_k=15, seed=7, max_tokens=max_tokens_for_early_stop(2700))
    result = decode(model, phoneme_ids, bert_features, prompt_tokens, sampling)
    result.tokens, result.idx, result.semantic_for_sovits

Rules (the official ``infer_panel`` and ``infer_panel_batch_infer``):
* for the first 11 steps the EOS column is dropped, so decoding cannot stop before 11 tokens;
* the next token is chosen by ``choose_next_tokens``: repetition penalty over every id in the
  prompt and the tokens so far, top-p on the penalised logits, temperature, top-k, then an
  exponential-race draw from an explicit ``torch.Generator`` (seeded by ``sampling.seed``);
* decoding stops when the drawn token or the argmax of the penalised logits is EOS (the drawn token
  is dropped), or after ``sampling.max_tokens`` tokens (the last one kept; the official
  ``early_stop_num`` E equals max_tokens E + 1, see ``max_tokens_for_early_stop``);
* ``idx`` is the 0-based step at the stop, 0 in reference-free mode, as the official code returns.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from models.gpt_sovits.t2s import Text2SemanticModel
from models.sampling import AutoregressiveSampling

MIN_STEPS_BEFORE_EOS = 11  # official: no stop in the first 11 steps (0.44 s of audio at 25 tokens/s)
OFFICIAL_STEP_LIMIT = 1500  # the official decoding loop's length


def max_tokens_for_early_stop(early_stop_num: int) -> int:
    """``max_tokens`` equivalent to the official ``early_stop_num``: it stops once more than
    early_stop_num tokens exist, keeping the last; -1 leaves only the 1500-step loop limit."""
    if early_stop_num == -1:
        return OFFICIAL_STEP_LIMIT
    if early_stop_num < 0:
        raise ValueError(f"early_stop_num {early_stop_num}: expected -1 (off) or a count >= 0")
    return min(early_stop_num + 1, OFFICIAL_STEP_LIMIT)


@dataclass(frozen=True)
class T2SDecoded:
    prompt: torch.Tensor  # (T_prompt,) int64; empty in reference-free mode
    tokens: torch.Tensor  # (n,) int64: the generated semantic tokens kept
    idx: int  # the official ``idx``: the step at the stop, 0 in reference-free mode
    stopped_by: str  # "eos" or "max_tokens"
    step_logits: torch.Tensor | None  # (steps, V) raw logits per step, before EOS drop and penalty

    @property
    def y(self) -> torch.Tensor:
        """(T_prompt + n,) the official ``y``: the prompt followed by the kept tokens."""
        return torch.cat([self.prompt, self.tokens])

    @property
    def semantic_for_sovits(self) -> torch.Tensor:
        """(n',) what the official web UI passes to SoVITS: ``y[-idx:]`` (all of ``y`` when idx is 0).
        After a max_tokens stop this drops the first generated token, as the web UI does."""
        return self.y[-self.idx:] if self.idx else self.y


def penalise_repeats(logits: torch.Tensor, previous_tokens: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (B, V), previous_tokens (B, L) -> (B, V): each id present in its row is divided by
    ``penalty`` where positive and multiplied where negative (once, however often it occurs)."""
    if penalty == 1.0 or previous_tokens.shape[1] == 0:
        return logits
    previous_tokens = previous_tokens.long()
    scores = logits.gather(1, previous_tokens)  # (B, L)
    scores = torch.where(scores < 0, scores * penalty, scores / penalty)
    return logits.scatter(1, previous_tokens, scores)


def choose_next_tokens(logits: torch.Tensor, previous_tokens: torch.Tensor, sampling: AutoregressiveSampling,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V') of one step (EOS column already dropped where it must be), previous_tokens
    (B, L) -> (tokens (B,) int64, penalised logits (B, V')).

    The official order: penalty; top-p on the penalised logits at temperature 1; temperature; top-k
    (ties with the k-th value kept); an exponential race, argmax(p / q) with q ~ Exp(1), which draws
    from p without a host sync. top_k = 1 keeps one candidate, so no draw is made.
    """
    penalised = penalise_repeats(logits, previous_tokens, sampling.repetition_penalty)
    if sampling.top_k == 1:
        return penalised.argmax(dim=-1), penalised
    filtered = penalised
    if sampling.top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(penalised, descending=True)  # (B, V')
        beyond_nucleus = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1) > sampling.top_p
        beyond_nucleus[:, 0] = False  # the most likely token always stays
        filtered = filtered.masked_fill(beyond_nucleus.scatter(1, sorted_ids, beyond_nucleus), float("-inf"))
    filtered = filtered / max(sampling.temperature, 1e-5)
    kth_best = torch.topk(filtered, min(sampling.top_k, filtered.shape[-1])).values[:, -1:]  # (B, 1)
    filtered = filtered.masked_fill(filtered < kth_best, float("-inf"))
    probabilities = F.softmax(filtered, dim=-1)  # (B, V')
    race = torch.empty_like(probabilities).exponential_(1.0, generator=generator)
    # A zero draw would turn a zero probability into 0/0 = NaN, which argmax would pick.
    race.clamp_min_(torch.finfo(race.dtype).tiny)
    return (probabilities / race).argmax(dim=-1), penalised


def check_max_tokens(sampling: AutoregressiveSampling) -> None:
    if sampling.max_tokens < 1:
        raise ValueError(f"max_tokens {sampling.max_tokens}: decoding needs at least 1 token")


def make_generator(sampling: AutoregressiveSampling, device: torch.device) -> torch.Generator | None:
    """A generator seeded by ``sampling.seed`` on ``device``; None (the global RNG) when seed is None."""
    return None if sampling.seed is None else torch.Generator(device=device).manual_seed(sampling.seed)


def step_candidates(logits: torch.Tensor, step: int, eos_from_step: int = MIN_STEPS_BEFORE_EOS) -> torch.Tensor:
    """(B, V) -> (B, V) or (B, V - 1): EOS, the last id, cannot be chosen before ``eos_from_step``."""
    return logits[:, :-1] if step < eos_from_step else logits


@torch.inference_mode()
def decode(model: Text2SemanticModel, phoneme_ids: torch.Tensor, bert_features: torch.Tensor,
           prompt_tokens: torch.Tensor | None, sampling: AutoregressiveSampling,
           record_logits: bool = False, eos_from_step: int = MIN_STEPS_BEFORE_EOS) -> T2SDecoded:
    """One utterance: phoneme_ids (T,) or (1, T), bert_features (1024, T) or (1, 1024, T),
    prompt_tokens (T_prompt,) or (1, T_prompt), or None for reference-free decoding.
    ``record_logits`` keeps every step's raw logits in ``step_logits`` (parity checks).
    ``eos_from_step`` >= ``sampling.max_tokens`` decodes exactly max_tokens tokens (timing runs)."""
    check_max_tokens(sampling)
    device = model.device
    phoneme_ids = phoneme_ids.reshape(1, -1).to(device)  # (1, T)
    bert_features = bert_features.reshape(1, bert_features.shape[-2], -1).to(device)  # (1, 1024, T)
    eos_id = model.config.eos_id
    if prompt_tokens is None:
        prompt = torch.zeros(1, 0, dtype=torch.long, device=device)
    else:
        prompt = prompt_tokens.reshape(1, -1).long().to(device)  # (1, T_prompt)
        check_prompt(prompt, eos_id)
    logits, cache = model.prefill(model.embed_text(phoneme_ids, bert_features),
                                  None if prompt_tokens is None else model.embed_audio(prompt, 0))

    def next_logits(token: torch.Tensor, step: int) -> torch.Tensor:
        nonlocal cache
        logits, cache = model.decode_step(model.embed_audio(token.view(1, 1), prompt.shape[1] + step), cache)
        return logits

    recorded = [] if record_logits else None
    history, stopped_by, step = decode_steps(logits, next_logits, prompt, sampling, eos_id, eos_from_step,
                                             make_generator(sampling, device), recorded)
    return T2SDecoded(prompt=prompt[0].cpu(), tokens=history[0, prompt.shape[1]:].cpu(),
                      idx=0 if prompt_tokens is None else step, stopped_by=stopped_by,
                      step_logits=torch.stack(recorded) if record_logits else None)


def decode_steps(logits: torch.Tensor, next_logits: Callable[[torch.Tensor, int], torch.Tensor],
                 prompt: torch.Tensor, sampling: AutoregressiveSampling, eos_id: int, eos_from_step: int,
                 generator: torch.Generator | None,
                 recorded: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, str, int]:
    """The module docstring's choice and stop rules for one utterance, whatever runs the model:
    ``logits`` (1, V) of the first step; ``next_logits(token (1,), step)`` runs step ``step``'s token
    through the model and returns the next logits. Returns (history (1, T_prompt + n), stopped_by,
    the step at the stop); ``recorded`` collects each step's raw logits when given."""
    history = prompt  # (1, T_prompt + tokens so far)
    for step in range(sampling.max_tokens):
        if recorded is not None:
            recorded.append(logits[0].float().cpu())
        token, penalised = choose_next_tokens(step_candidates(logits, step, eos_from_step), history, sampling,
                                              generator)
        history = torch.cat([history, token.view(1, 1)], dim=1)
        if int(token) == eos_id or int(penalised.argmax(dim=-1)) == eos_id:
            return history[:, :-1], "eos", step
        if step + 1 == sampling.max_tokens:
            break
        logits = next_logits(token, step)
    return history, "max_tokens", step


@torch.inference_mode()
def decode_batch(model: Text2SemanticModel, phoneme_ids: Sequence[torch.Tensor],
                 bert_features: Sequence[torch.Tensor], prompt_tokens: torch.Tensor | None,
                 sampling: AutoregressiveSampling, text_length: int | None = None,
                 record_logits: bool = False) -> list[T2SDecoded]:
    """Several utterances in one batch, as the official ``infer_panel_batch_infer`` (``parallel_infer``).

    phoneme_ids: B tensors (T_i,); bert_features: B tensors (1024, T_i); prompt_tokens (B, T_prompt).
    Each text is embedded unpadded, then left-padded with zero vectors to ``text_length`` (default
    the longest) and its padded columns hidden. A row leaves the batch when it finishes. As in the
    official batch path, a row's last token is dropped whichever way it stopped. Without a prompt,
    each utterance is decoded on its own (the official path falls back the same way).
    """
    if len(phoneme_ids) != len(bert_features):
        raise ValueError(f"{len(phoneme_ids)} phoneme id sequences but {len(bert_features)} BERT feature tensors")
    if prompt_tokens is None:
        return [decode(model, ids, bert, None, sampling, record_logits)
                for ids, bert in zip(phoneme_ids, bert_features)]
    check_max_tokens(sampling)
    device = model.device
    eos_id = model.config.eos_id
    batch = len(phoneme_ids)
    lengths = [int(ids.shape[-1]) for ids in phoneme_ids]
    text_length = max(lengths) if text_length is None else text_length
    if text_length < max(lengths):
        raise ValueError(f"text_length {text_length} is shorter than the longest text, {max(lengths)} phoneme ids")
    prompt = prompt_tokens.long().to(device)  # (B, T_prompt)
    if prompt.shape[0] != batch:
        raise ValueError(f"prompt_tokens has {prompt.shape[0]} rows for {batch} texts")
    check_prompt(prompt, eos_id)
    texts = [model.embed_text(ids.reshape(1, -1).to(device), bert.reshape(1, bert.shape[-2], -1).to(device))
             for ids, bert in zip(phoneme_ids, bert_features)]  # B x (1, T_i, D)
    text = torch.cat([F.pad(t, (0, 0, text_length - t.shape[1], 0)) for t in texts])  # (B, T_text, D), left-padded
    text_padding = torch.arange(text_length, device=device) < torch.tensor(
        [text_length - n for n in lengths], device=device).unsqueeze(1)  # (B, T_text)
    logits, cache = model.prefill(text, model.embed_audio(prompt, 0), text_padding)
    generator = make_generator(sampling, device)
    history = prompt  # (B_active, T_prompt + tokens so far)
    active = list(range(batch))  # original row of each active row
    recorded: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    results: dict[int, T2SDecoded] = {}

    def finish(row: int, original: int, step: int, stopped_by: str) -> None:
        results[original] = T2SDecoded(
            prompt=prompt[original].cpu(), tokens=history[row, prompt.shape[1]:-1].cpu(), idx=step,
            stopped_by=stopped_by, step_logits=torch.stack(recorded[original]) if record_logits else None)

    for step in range(sampling.max_tokens):
        if record_logits:
            for row, original in enumerate(active):
                recorded[original].append(logits[row].float().cpu())
        tokens, penalised = choose_next_tokens(step_candidates(logits, step), history, sampling, generator)
        history = torch.cat([history, tokens.unsqueeze(1)], dim=1)
        ended = ((tokens == eos_id) | (penalised.argmax(dim=-1) == eos_id)).tolist()
        for row, original in enumerate(active):
            if ended[row]:
                finish(row, original, step, "eos")
            elif step + 1 == sampling.max_tokens:
                finish(row, original, step, "max_tokens")
        if len(results) == batch:
            break
        kept = [row for row in range(len(active)) if not ended[row]]
        if len(kept) < len(active):
            rows = torch.tensor(kept, device=device)
            history, tokens = history.index_select(0, rows), tokens.index_select(0, rows)
            cache = cache.select_rows(rows)
            active = [active[row] for row in kept]
        logits, cache = model.decode_step(model.embed_audio(tokens.unsqueeze(1), prompt.shape[1] + step), cache)
    return [results[row] for row in range(batch)]


def check_prompt(prompt: torch.Tensor, eos_id: int) -> None:
    if prompt.numel() and (int(prompt.min()) < 0 or int(prompt.max()) >= eos_id):
        raise ValueError(f"prompt semantic tokens must lie in [0, {eos_id}) (codebook ids), got "
                         f"[{int(prompt.min())}, {int(prompt.max())}]")
