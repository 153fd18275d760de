"""The learning-rate schedule every training loop here uses."""
from __future__ import annotations

import math


def learning_rate(step: int, steps: int, peak_lr: float, final_lr_fraction: float, warmup_steps: int) -> float:
    """Linear warm-up to ``peak_lr``, then cosine down to ``peak_lr * final_lr_fraction`` at ``steps``.

    A function of the step alone, so a resumed run needs no scheduler state. Warm-up matters when
    fine-tuning: Adam's first updates move every weight by about ``lr`` at once.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / max(steps - warmup_steps, 1), 1.0)
    return peak_lr * (final_lr_fraction + (1 - final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * progress)))
