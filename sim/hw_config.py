"""The ``[hw]`` section: parameters of the on-chip arithmetic and datapath.

Owned by the bit-exact model (sim/hw) and the generator (rtl_gen); read through
``Config.hw``. Fields are declared with :func:`sim.schema.opt` so they are
validated at load time like every other section. The meaning of every field,
and the formats and widths derived from them, are written down in
``docs/arithmetic.md`` (the hardware arithmetic contract).

Naming: ``*_frac_bits`` are fractional bits of a fixed-point quantity,
``*_shift`` are power-of-two rates (a rate of ``2**-shift``, applied by an
arithmetic shift), ``switch_*`` / ``bop_*`` / ``iir_*`` / ``sgd_*`` belong to
one hardware weight optimiser each.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import ConfigError, opt

__all__ = ["HW_OPTIMIZERS", "LAYER_FIELD_BITS", "STREAM_BITS", "HwConfig", "LayerLanes", "layer_lanes"]

HW_OPTIMIZERS = ("switch", "bop", "iir", "sgd")

#: bits of one beat of the accelerator's host streams (``rtl_gen.buffers.BEAT_BITS``): an engine word of
#: ``lanes_in`` bits must split into beats or be made of whole beats
STREAM_BITS = 32

#: bits of the register-map fields that number a weight layer (``rtl_gen.controller.build_regmap``): the
#: generated RTL holds at most ``2**LAYER_FIELD_BITS - 1`` weight layers
LAYER_FIELD_BITS = 4


@dataclass
class HwConfig:
    optimizer: str = opt("switch", choices=HW_OPTIMIZERS, doc="hardware weight optimiser")
    input: str = opt(
        "auto",
        choices=("auto", "int8", "binary"),
        doc="first-layer input: 8-bit pixels (x - 128) or +-1 by threshold; auto = binary when "
        "model.input_format = 'binary', else int8",
    )
    # -- forward / BN -------------------------------------------------------------------------
    beta_frac_bits: int = opt(16, lo=4, hi=24, doc="fractional bits of the BN bias beta")
    beta_int_bits: int = opt(4, lo=2, hi=8, doc="integer bits of beta incl. sign: beta in [-2**(I-1), 2**(I-1))")
    alpha_frac_bits: int = opt(10, lo=2, hi=16, doc="fractional bits of alpha = mean|x| (Q.F, unsigned)")
    logit_frac_bits: int = opt(8, lo=2, hi=16, doc="fractional bits of the output-layer logits")
    exp_frac_bits: int = opt(16, lo=4, hi=24, doc="cross-entropy: fractional bits of the 2^f table entries")
    prob_frac_bits: int = opt(16, lo=4, hi=24, doc="cross-entropy: fractional bits of softmax / loss gradient")
    recip_guard_bits: int = opt(8, lo=2, hi=24, doc="guard bits of the per-channel reciprocal used for logits")
    running_frac_bits: int = opt(8, lo=0, hi=16, doc="fractional bits of the running BN mean / scale (units of Y)")
    running_shift: int = opt(3, lo=1, hi=12, doc="running BN statistics: EMA rate 2**-shift")
    # -- beta optimiser -------------------------------------------------------------------------
    beta_momentum_shift: int = opt(3, lo=0, hi=12, doc="beta update: EMA rate 2**-shift of dbeta (0 = none)")
    beta_scale_shift: int = opt(7, lo=0, hi=16, doc="beta update: EMA rate 2**-shift of |dbeta| (the normaliser)")
    beta_state_bits: int = opt(24, lo=8, hi=48, doc="mantissa bits of the two block-floating-point beta EMAs")
    # -- weight gradient -------------------------------------------------------------------------
    dw_window: int = opt(0, lo=0, hi=255, doc="sgn(dW) from the codes within this many exponent planes of each "
                         "column's largest, each counted +-1 (one signed popcount per weight); 0 = the full po2 "
                         "sum")
    # -- random numbers ---------------------------------------------------------------------------
    rng_seed: int = opt(1, lo=0, hi=2**32 - 1, doc="seed of the xorshift32 generators (one per weight column block)")
    rng_block: int = opt(256, lo=1, hi=65536, doc="rows of one weight column served by one generator")
    # -- stochastic switch memory (seed 004, Network VII) ---------------------------------------
    switch_cutoff: int = opt(63, lo=1, hi=32767, doc="saturation C of the per-weight gradient-sign accumulator")
    switch_sigma: float = opt(0.5, lo=0.0, hi=1.0, hi_open=True, doc="switching starts at w*acc >= sigma*C")
    switch_lambda: float = opt(0.5, lo=0.0, lo_open=True, hi=1.0, doc="switch probability at w*acc = C")
    switch_anneal: float = opt(1.0, lo=0.0, hi=8.0, doc="threshold rises with the schedule: sigma_eff = 1 - (1 - "
                               "sigma) (lr/lr0)**anneal (0 = fixed sigma)")
    switch_rate: float = opt(1.0, lo=0.0, lo_open=True, hi=1.0, doc="probability that an accumulator takes a "
                             "gradient sign at the initial learning rate (gate 2**16 min(rate lr/lr0, 1)): a "
                             "smaller cutoff with rate C/63 keeps the preset's pace in fewer bits")
    switch_reset: bool = opt(False, doc="clear the accumulator of a weight when it switches")
    switch_undo: bool = opt(False, doc="re-run the batch after the update and revert it if the loss rose")
    # -- Bop-style momentum threshold -------------------------------------------------------------
    bop_shift: int = opt(6, lo=1, hi=14, doc="EMA rate gamma = 2**-shift of the gradient sign")
    bop_frac_bits: int = opt(8, lo=2, hi=16, doc="fractional bits of the EMA m (in [-1, 1])")
    bop_threshold: float = opt(0.25, lo=0.0, hi=1.0, hi_open=True, doc="flip when w*m > threshold")
    # -- 2nd-order IIR filter (seed 002) ------------------------------------------------------------
    iir_gamma_shift: int = opt(3, lo=1, hi=14, doc="first EMA rate gamma = 2**-shift (1 - momentum)")
    iir_alpha_shift: int = opt(10, lo=1, hi=20, doc="second EMA rate alpha = 2**-shift at the start")
    iir_m_frac_bits: int = opt(6, lo=2, hi=16, doc="fractional bits of the first EMA m")
    iir_g_frac_bits: int = opt(8, lo=2, hi=24, doc="fractional bits of the filter output g")
    iir_max_decay_shift: int = opt(8, lo=0, hi=16, doc="alpha decay stops at alpha * 2**-this")
    # -- latent fixed-point weights (conventional baseline) --------------------------------------
    sgd_latent_bits: int = opt(12, lo=3, hi=24, doc="latent weight bits incl. sign (Q0.(bits-1), in [-1, 1))")
    sgd_momentum_shift: int = opt(3, lo=0, hi=12, doc="EMA rate 2**-shift of the gradient sign; 0 = no momentum")
    sgd_momentum_frac_bits: int = opt(4, lo=1, hi=16, doc="fractional bits of the momentum (in [-1, 1])")
    sgd_init_shift: int = opt(4, lo=0, hi=24, doc="initial |latent| uniform in [0, 2**-shift)")
    # -- limits ---------------------------------------------------------------------------------------
    max_acc_bits: int = opt(62, lo=16, hi=62, doc="widest per-element accumulator the datapath may need")
    check_widths: bool = opt(
        True, doc="reject configurations whose derived hardware widths exceed max_acc_bits (false: float-only runs)"
    )
    # -- RTL parallelism (rtl_gen.top; docs/architecture.md) ------------------------------------------
    lanes_in: int = opt(
        64, lo=1, hi=4096, doc="XNOR / po2 engines: input bits per word (divides or is a multiple of 32)"
    )
    lanes_out: int = opt(16, lo=1, hi=4096, doc="XNOR engine, BN, po2 and dX units: output channels per beat")
    # defaults: the fewest LUTs that keep the paper's MLP under 4,000 cycles per image (docs/results.md)
    lanes_b: int = opt(1, lo=1, hi=256, doc="dW engine: samples per beat (1: the cheapest dW arithmetic)")
    dw_passes: int = opt(
        4, lo=1, hi=32, doc="dW engine: passes over the batch per weight tile (power of two; fewer accumulators)"
    )
    dx_passes: int = opt(
        4, lo=1, hi=32, doc="dX engine: passes over the groups per input word (power of two; fewer adder trees)"
    )
    dw_dsp: bool = opt(
        True, doc="dW engine: accumulate in DSP48 multiply-accumulates, two weights per slice (binary activations, "
        "lanes_b = 1); false: fabric adders"
    )
    dx_dsp: bool = opt(
        True, doc="dX engine: run on the dW engine's DSP48 multiply-accumulates where the layers allow it (dw_dsp, "
        "binary activations, lanes_b = 1, lanes_out a multiple of dw_passes, dX words of lanes_in / dw_passes values "
        "equal to the layer below's lanes_out); false: fabric adder trees (dx_passes)"
    )
    po2_lanes: int = opt(
        4, lo=1, hi=4096, doc="po2 unit: lanes of the first pass's normalise / compare datapath (divides lanes_out; "
        "a beat takes lanes_out / po2_lanes cycles)"
    )
    loss_lanes: int = opt(
        1, lo=1, hi=4096, doc="logit and loss units: classes per cycle (divides lanes_out; at most lanes_out)"
    )
    update_lanes: int = opt(16, lo=1, hi=4096, doc="weight update sweep: weights per cycle (divides lanes_in)")
    div_steps: int = opt(4, lo=1, hi=64, doc="quotient bits per cycle of the per-channel sequential dividers")
    mul_steps: int = opt(4, lo=1, hi=64, doc="po2 unit: bits per cycle of the per-channel sqrt2 multiplier")

    def _validate(self, path):
        _divides_or_multiple_of_beat(f"{path}.lanes_in", self.lanes_in)
        for name in ("dw_passes", "dx_passes"):
            v = getattr(self, name)
            if v & (v - 1):
                raise ConfigError(f"{path}.{name} = {v} must be a power of two (1, 2, 4, 8, 16, 32)")
        if self.switch_cutoff >= 2**15:
            raise ConfigError(f"{path}.switch_cutoff = {self.switch_cutoff} is out of range; allowed: <= 32767")
        if self.iir_g_frac_bits < self.iir_m_frac_bits:
            raise ConfigError(
                f"{path}.iir_g_frac_bits = {self.iir_g_frac_bits} must be >= iir_m_frac_bits = {self.iir_m_frac_bits}"
            )
        if self.sgd_init_shift >= self.sgd_latent_bits:
            raise ConfigError(
                f"{path}.sgd_init_shift = {self.sgd_init_shift} must be < sgd_latent_bits = {self.sgd_latent_bits}"
            )

    def input_kind(self, cfg) -> str:
        """The resolved first-layer input format: ``"int8"`` or ``"binary"``."""
        if self.input != "auto":
            return self.input
        return "binary" if cfg.model.input_format == "binary" else "int8"

    def check_against(self, cfg) -> None:
        """Cross-section checks: the RTL lane geometry of every layer (:func:`layer_lanes`) and, with
        ``check_widths``, the derived widths that could overflow; raises ConfigError."""
        from .hw.widths import check_widths, hw_supported

        if hw_supported(cfg):
            layer_lanes(cfg)
        if self.check_widths:
            check_widths(cfg)


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _divides_or_multiple_of_beat(name: str, v: int) -> int:
    if v < 1 or (v < STREAM_BITS and STREAM_BITS % v) or (v > STREAM_BITS and v % STREAM_BITS):
        raise ConfigError(f"{name} = {v}: must divide {STREAM_BITS} or be a multiple of {STREAM_BITS} "
                          "(1, 2, 4, 8, 16, 32, 64, ...)")
    return v


@dataclass(frozen=True)
class LayerLanes:
    """The parallelism of one dense weight layer in the generated RTL (``rtl_gen.top.LayerPlan``)."""

    lanes_in: int  # input bits per engine word
    lanes_out: int  # channels per beat
    lanes_b: int  # samples per dW beat
    update_lanes: int  # weights per update visit
    dw_passes: int  # dW passes per tile
    dx_passes: int  # dX passes per input word


def layer_lanes(cfg) -> list[LayerLanes]:
    """Every weight layer's lanes as the RTL generator builds them from ``cfg.hw`` (dense layers), after
    checking that they fit together: engine words split into or are made of 32-bit beats, each layer's
    channels per beat pack into the next layer's words and cut evenly into its dX beats, the generators'
    ``rng_block`` holds whole words, ``update_lanes`` divides the words, ``loss_lanes`` and ``po2_lanes``
    divide the channels per beat, at most 15 weight layers (:data:`LAYER_FIELD_BITS`). Raises
    :class:`ConfigError` naming the field. Shared by the configuration's validation (so ``xnortrain config``
    refuses what ``generate`` would) and ``rtl_gen.top.SystemPlan``."""
    h = cfg.hw
    _divides_or_multiple_of_beat("hw.lanes_in", h.lanes_in)
    wl = cfg.weight_layers()
    L = len(wl)
    if L >= 1 << LAYER_FIELD_BITS:
        raise ConfigError(f"model.layers: {L} weight layers; the generated RTL numbers layers in a "
                          f"{LAYER_FIELD_BITS}-bit register field, at most {(1 << LAYER_FIELD_BITS) - 1} layers")
    lis = []
    for s in wl:
        n_in = s.weight_shape[0]
        li = h.lanes_in if n_in >= h.lanes_in else min(h.lanes_in, _pow2_ceil(n_in))
        lis.append(_divides_or_multiple_of_beat("hw.lanes_in", li))
    B = cfg.train.batch_size
    out = []
    for j, s in enumerate(wl):
        n_out = s.weight_shape[1]
        li = lis[j]
        if j == L - 1:
            # all lanes even past the classes (padding lanes): the output layer's po2 backward engine then
            # matches the hidden layers' and is shared with them
            lo = h.lanes_out
        else:
            lo = min(h.lanes_out, _pow2_floor(n_out))
            if lis[j + 1] % lo:
                raise ConfigError(f"hw.lanes_out = {h.lanes_out}: layer {j} packs {lo} channels per beat into "
                                  f"words of {lis[j + 1]} bits for layer {j + 1}; use powers of two")
            ls = lis[j + 1] // min(h.dx_passes, lis[j + 1])  # dX values per beat of layer j + 1
            if ls % lo and lo % ls:
                raise ConfigError(f"hw.dx_passes = {h.dx_passes}: layer {j + 1}'s dX beats of {ls} values do not "
                                  f"cut into layer {j}'s BN beats of {lo} channels (hw.lanes_out); use powers "
                                  f"of two for hw.lanes_in")
        if h.rng_block % li:
            raise ConfigError(f"hw.rng_block = {h.rng_block} must be a multiple of layer {j}'s lanes_in = {li}")
        u = min(h.update_lanes, li)
        if li % u:
            raise ConfigError(f"hw.update_lanes = {h.update_lanes} must divide lanes_in = {li} (layer {j})")
        if lo % min(h.po2_lanes, lo):
            raise ConfigError(f"hw.po2_lanes = {h.po2_lanes} must divide lanes_out = {lo} (layer {j})")
        out.append(LayerLanes(li, lo, min(h.lanes_b, B), u, min(h.dw_passes, li), min(h.dx_passes, li)))
    top = out[-1].lanes_out
    if top % min(h.loss_lanes, top):
        raise ConfigError(f"hw.loss_lanes = {h.loss_lanes} must divide the output layer's lanes_out = {top} "
                          "(hw.lanes_out)")
    return out
