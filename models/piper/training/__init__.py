"""Piper's training code: the student decoder rebuilt with its shapes and its teacher latents,
the Lite student's distillation, and the pruning of its HiFi-GAN decoder and text-encoder
feed-forward layers. The family-neutral blocks they use live in models/training/."""
