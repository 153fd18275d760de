"""Residual vector quantization (nearest-codebook search and lookup, stage after stage) in TensorRT-native ops.

GPT-SoVITS-style codecs quantize a latent with S codebooks in turn, each coding what the previous
stages left. The reference uses ``torch.cdist`` + argmin; its export path is opaque (CDist is not
an ONNX op and decomposes into broadcasts over (B, T, K, D)). ``MatMulResidualVQ`` writes the
squared distance as ``|c|^2 - 2 r.c`` (|r|^2 is the same for every code; one MatMul per stage,
codebook norms precomputed), then ArgMin over the codebook and a Gather, stages unrolled.

    export_form = MatMulResidualVQ.from_reference(reference)   # same codebooks, same codes
"""
from __future__ import annotations

import torch
from torch import nn


class ResidualVQ(nn.Module):
    """Reference. codebooks: (S, K, D). x: (B, T, D) -> (quantized (B, T, D), codes (B, T, S) int64)."""

    def __init__(self, codebooks: torch.Tensor):
        super().__init__()
        self.codebooks = nn.Parameter(codebooks.clone())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        residual, quantized, codes = x, torch.zeros_like(x), []
        for codebook in self.codebooks:  # (K, D)
            distances = torch.cdist(residual, codebook.unsqueeze(0).expand(x.shape[0], -1, -1))  # (B, T, K)
            index = distances.argmin(dim=-1)  # (B, T)
            chosen = codebook[index]  # (B, T, D)
            quantized = quantized + chosen
            residual = residual - chosen
            codes.append(index)
        return quantized, torch.stack(codes, dim=-1)


class MatMulResidualVQ(nn.Module):
    """Same function as ResidualVQ with MatMul + ArgMin + Gather per stage, unrolled."""

    def __init__(self, codebooks: torch.Tensor):
        super().__init__()
        self.codebooks = nn.Parameter(codebooks.clone())  # (S, K, D)
        self.register_buffer("codebook_norms", codebooks.pow(2).sum(-1).clone())  # (S, K)

    @classmethod
    def from_reference(cls, reference: ResidualVQ) -> "MatMulResidualVQ":
        return cls(reference.codebooks.detach())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        residual, quantized, codes = x, torch.zeros_like(x), []
        for stage in range(self.codebooks.shape[0]):
            codebook = self.codebooks[stage]  # (K, D)
            # |r - c|^2 without the |r|^2 term, which is the same for every code and cannot move the argmin.
            distances = self.codebook_norms[stage] - 2 * residual @ codebook.transpose(0, 1)  # (B, T, K)
            index = distances.argmin(dim=-1)  # (B, T)
            chosen = torch.nn.functional.embedding(index, codebook)  # Gather: (B, T, D)
            quantized = quantized + chosen
            residual = residual - chosen
            codes.append(index)
        return quantized, torch.stack(codes, dim=-1)
