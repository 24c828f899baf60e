"""On-chip memory of the hardware model: weights, optimiser state and one batch's buffers.

:func:`memory_report` itemises every stored array of the training step (docs/arithmetic.md,
"Memory") and compares the total with the Zynq-7020's 140 BRAM36 (630 KiB).
"""

from __future__ import annotations

from .arith import ArithParams
from .optim import PROB_BITS, state_bits
from .widths import bn_spatial, layer_bounds, pools_after, pools_before_bn, signed_bits

__all__ = ["memory_report", "ZYNQ7020_KIB", "BRAM36_BITS"]

BRAM36_BITS = 36 * 1024
ZYNQ7020_BRAM36 = 140
ZYNQ7020_KIB = ZYNQ7020_BRAM36 * BRAM36_BITS / 8 / 1024  # 630 KiB


def _kib(bits: int) -> float:
    return bits / 8 / 1024


def memory_report(cfg) -> dict:
    """Bits per weight, KiB of weights + state and of one batch's buffers, and whether it fits."""
    h = cfg.hw
    p = ArithParams.from_config(cfg)
    bounds = layer_bounds(cfg)
    wl = cfg.weight_layers()
    B = cfg.train.batch_size
    n_w = cfg.n_weights
    per_weight = state_bits(h)
    bpw = sum(per_weight.values())
    ws_bits = n_w * bpw
    buf: dict[str, int] = {}
    first_bits = 8 if h.input_kind(cfg) == "int8" else 1
    pools = pools_after(cfg)
    first = pools_before_bn(cfg)
    # values per image a layer's BN sees: its Y, or the pooled Y with maxpool before_bn (the conv output streams
    # through the pooling; only the pooled Y, its window indices and, backwards, the pooled dY codes are kept)
    bn_size = [s.out_channels * sp for s, sp in zip(wl, bn_spatial(cfg), strict=True)]
    buf[f"retained inputs X_hat (1 bit; first layer {first_bits} bits)"] = sum(
        B * s.in_size * (first_bits if j == 0 else 1) for j, s in enumerate(wl)
    )
    # a pooled conv layer: the next layer's input and mask are the pooled values; its own BN backward reads the
    # signs of every position before the pooling (BN before the pooling), and the pooling's window index says
    # where each value came from
    buf["straight-through masks (1 bit)"] = sum(B * wl[j + 1].in_size for j in range(len(wl) - 1))
    pooled = [j for j in range(len(wl)) if pools[j]]
    if any(not first[j] for j in pooled):
        buf["signs before pooling (1 bit)"] = sum(B * wl[j].out_size for j in pooled if not first[j])
    if pooled:
        buf["max-pool window indices"] = sum(
            B * wl[j + 1].in_size * max((pools[j] ** 2 - 1).bit_length(), 1) for j in pooled)
    y_bits = max(B * size * signed_bits(b.y) for size, b in zip(bn_size, bounds, strict=True))
    dx_bits = max((B * wl[j].in_size * signed_bits(bounds[j].dX) for j in range(1, len(wl))), default=0)
    # Y is dead before the backward pass starts and dX is born after it: one buffer serves both.
    buf["Y / dX shared buffer (largest layer)"] = max(y_bits, dx_bits)
    buf["output logits"] = B * wl[-1].out_size * signed_bits(bounds[-1].logit_q)
    buf["dY po2 codes + exponent scratch (largest layer)"] = max(B * size * (p.k + 2) for size in bn_size)
    per_channel = (
        signed_bits(1 << (p.beta_int - 1 + p.beta_frac))  # beta
        + 2 * h.beta_state_bits  # beta EMAs m, |.| (block floating point; + 8-bit exponent per layer)
        + 2 * signed_bits(bounds[0].running)  # running mean / scale (widest layer)
    )
    n_ch = sum(s.out_channels for s in wl)
    buf["per-channel BN state (beta, its EMAs, running stats)"] = per_channel * n_ch + 8 * len(wl)
    buf["per-channel retained S, alpha"] = sum(
        s.out_channels * (signed_bits(b.S) + signed_bits(b.alpha_q)) for s, b in zip(wl, bounds, strict=True)
    )
    buf["per-channel scratch (thresholds, P1, P2; largest layer)"] = max(
        s.out_channels * (3 * signed_bits(b.theta) + 2 * signed_bits(b.P)) for s, b in zip(wl, bounds, strict=True)
    )
    n_gen = sum(-(-s.fan_in // h.rng_block) * s.out_channels for s in wl)
    buf["RNG states (xorshift32)"] = 32 * n_gen
    if p.loss == "cross_entropy":
        buf["softmax 2^f table"] = (1 << p.logit_frac) * (p.exp_frac + 1)
    if h.optimizer == "switch":
        buf["switch probability table"] = (h.switch_cutoff + 1) * (PROB_BITS + 1)
    buf_bits = sum(buf.values())
    total_bits = ws_bits + buf_bits
    return {
        "optimizer": h.optimizer,
        "n_weights": n_w,
        "state_bits": per_weight,
        "bits_per_weight": bpw,
        "weights_state_kib": round(_kib(ws_bits), 2),
        "buffers": {k: round(_kib(v), 2) for k, v in buf.items()},
        "buffers_kib": round(_kib(buf_bits), 2),
        "total_kib": round(_kib(total_bits), 2),
        "bram36_lower_bound": -(-total_bits // BRAM36_BITS),
        "budget_kib": ZYNQ7020_KIB,
        "fits": total_bits <= ZYNQ7020_BRAM36 * BRAM36_BITS,
    }
