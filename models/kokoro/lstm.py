"""Kokoro's bidirectional LSTMs over padded batches, run in eager PyTorch and exported whole.

Every item's reverse direction starts at its own last valid step and outputs past an item's length
are zero, so a padded batch equals its items run alone (as the official packed modules do).

Eager runs pack the batch. Under export the same LSTM is emitted as one ONNX ``LSTM`` node with its
``sequence_lens`` input, which has exactly these semantics: torch's own LSTM decomposition needs a
concrete step count, and the frame-level LSTM runs over a frame count known only after the
durations are predicted (an unbacked symbol in torch.export).
"""
from __future__ import annotations

import torch
from torch import nn

ONNX_LSTM_OPSET = 14  # the LSTM definition with the ``layout`` attribute (left at 0: time first)


def _onnx_gate_order(weight: torch.Tensor, hidden: int) -> torch.Tensor:
    """torch's gate blocks (input, forget, cell, output) -> ONNX's (input, output, forget, cell)."""
    input_gate, forget_gate, cell_gate, output_gate = weight.split(hidden, dim=0)
    return torch.cat([input_gate, output_gate, forget_gate, cell_gate], dim=0)


def _onnx_lstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    hidden = lstm.hidden_size
    directions = ("", "_reverse")
    weight_input = torch.stack([_onnx_gate_order(getattr(lstm, f"weight_ih_l0{d}"), hidden) for d in directions])
    weight_recurrent = torch.stack([_onnx_gate_order(getattr(lstm, f"weight_hh_l0{d}"), hidden) for d in directions])
    bias = torch.stack([torch.cat([_onnx_gate_order(getattr(lstm, f"bias_ih_l0{d}"), hidden),
                                   _onnx_gate_order(getattr(lstm, f"bias_hh_l0{d}"), hidden)]) for d in directions])
    time_first = x.transpose(0, 1)  # (T, B, C)
    steps, batch = time_first.shape[0], time_first.shape[1]
    out = torch.onnx.ops.symbolic(
        "LSTM", (time_first, weight_input, weight_recurrent, bias, lengths.to(torch.int32)),
        {"direction": "bidirectional", "hidden_size": hidden},
        dtype=x.dtype, shape=(steps, 2, batch, hidden), version=ONNX_LSTM_OPSET)  # (T, 2, B, H)
    return out.permute(2, 0, 1, 3).reshape(batch, steps, 2 * hidden)  # (B, T, 2H)


def run_bilstm(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
    """A one-layer, batch-first BiLSTM over (B, T, C) -> (B, T, 2H). ``lengths`` (B,) valid steps
    per item; None runs every item over all T steps (the official unpacked call)."""
    if lengths is None:
        return lstm(x)[0]
    if torch.compiler.is_exporting():
        return _onnx_lstm(lstm, x, lengths)
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, _ = nn.utils.rnn.pad_packed_sequence(lstm(packed)[0], batch_first=True, total_length=x.shape[1])
    return out  # (B, T, 2H)


def length_mask(lengths: torch.Tensor, steps: int) -> torch.Tensor:
    """(B,) valid lengths -> (B, 1, steps) float mask, 1 on valid steps."""
    positions = torch.arange(steps, device=lengths.device).view(1, 1, -1)
    return (positions < lengths.view(-1, 1, 1)).to(torch.float32)
