"""The host's view of a :class:`rtl_gen.plan.SystemPlan`: every quantity the host can read back or restore (its
stream layout, the unit and storage space that hold it), the batch and label formats, the register map and the
description written to ``accelerator.json`` (:class:`rtl_gen.contract.AcceleratorDescription`) with its hash.
:class:`HostInterfacePlan` is mixed into :class:`~rtl_gen.plan.SystemPlan`, whose layers and geometries it reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.hw.optim import PROB_BITS

from .contract import AcceleratorDescription, QuantityLayout, description_hash
from .controller import (
    SPACE_A,
    SPACE_BETA,
    SPACE_E,
    SPACE_M,
    SPACE_MU,
    SPACE_S,
    bn_param_sizes,
    build_regmap,
)
from .loss_unit import OutputGeometry
from .rng import RngGeometry

__all__ = ["E_WIDTH", "HostInterfacePlan", "HostQuantity"]

#: Bits of the BN bias exponent ``e_beta`` (a host quantity, and the width of the top level's ``unit_exp``).
E_WIDTH = 16


@dataclass
class HostQuantity:
    """A quantity on the host path: its stream layout, the unit that holds it (``target``: ``("wm", j)``,
    ``("rng", j)``, ``("bnp", j)``, ``("logits",)``), the unit's storage ``space``, the number of accesses
    (``count``), ``inner`` positions per outer address, and the word width."""

    layout: QuantityLayout
    target: tuple
    space: int
    count: int
    inner: int
    width: int


class HostInterfacePlan:
    """The quantities, layouts, register map and description of a plan (a mixin of
    :class:`~rtl_gen.plan.SystemPlan`; ``_declare_quantities`` runs at the end of its constructor)."""

    # -- quantities -----------------------------------------------------------------------------------------

    def _kind(self, name: str) -> int:
        return self.kinds.setdefault(name, len(self.kinds))

    def _add(self, name, layer, shape, *, target, space, count, inner, width, elem_bits, elems_per_word, pad=None,
             reshape=None, transpose=None, signed=False, encoding="int", access="rw", skip=False):
        n = math.prod(shape) if shape else 1
        pad = tuple(pad) if pad is not None else (tuple(shape) if shape else ())
        if reshape is None:
            reshape = (math.prod(pad) if pad else 1,)
            transpose = (0,)
        if not shape:
            pad, reshape, transpose = (), (1,), (0,)
        q = QuantityLayout(name, layer, self._kind(name), tuple(shape), elem_bits, elems_per_word, pad, reshape,
                           transpose, signed=signed, encoding=encoding, access=access, skip_pad_words=skip)
        assert q.words == count, (name, layer, q.words, count)
        del n
        self.quantities.append(HostQuantity(q, target, space, count, inner, width))

    def _declare_quantities(self):
        h = self.cfg.hw
        for lp in self.layers:
            j, g = lp.index, lp.geometry
            W, G, li, lo, U = g.words, g.groups, lp.lanes_in, lp.lanes_out, lp.update_lanes
            sweep = lp.sweep
            # weight banks: bank l, row grp * words + k holds w[k*li:(k+1)*li, grp*lo + l]; one access per (row, lane)
            self._add("w", j, (lp.n_in, lp.n_out), target=("wm", j), space=0, count=g.depth * lo, inner=lo,
                      width=li, elem_bits=1, elems_per_word=li, pad=(W * li, G * lo), reshape=(W, li, G, lo),
                      transpose=(2, 0, 3, 1), encoding="sign")
            # optimiser state, each field in its own space: one row of U values per visit of the update sweep
            # (padding visits skipped)
            chunks = li // U
            wm_geo = self.wmem_geometry(j)
            for fname, bits in self.opt.fields:
                if fname == "undo":  # lives within one step (written by UPDATE, read by UNDO): not state
                    continue
                self._add(fname, j, (lp.n_in, lp.n_out), target=("wm", j), space=wm_geo.field_space(fname),
                          count=sweep.visits, inner=1, width=U * bits, elem_bits=bits, elems_per_word=U,
                          pad=(W * li, G * lo), reshape=(W, chunks, U, G, lo), transpose=(3, 0, 4, 1, 2),
                          signed=True, skip=True)
            ng = RngGeometry(sweep=sweep, block=h.rng_block).generators
            self._add("rng", j, (ng,), target=("rng", j), space=0, count=ng, inner=1, width=32, elem_bits=32,
                      elems_per_word=1)
            if h.optimizer == "switch":
                self._add("switch_table", j, (h.switch_cutoff + 1,), target=("wm", j), space=2,
                          count=h.switch_cutoff + 1, inner=1, width=PROB_BITS + 1, elem_bits=PROB_BITS + 1,
                          elems_per_word=1, access="wo")
            bnp = bn_param_sizes(self.bn_param_layer(j), h)
            M = lp.n_out
            for name, space, bits, sgn in (("beta", SPACE_BETA, bnp["beta"], True),
                                           ("m_beta", SPACE_M, bnp["m"], True),
                                           ("a_beta", SPACE_A, bnp["a"], False),
                                           ("mu_r", SPACE_MU, bnp["running"], True),
                                           ("s_r", SPACE_S, bnp["running"], True)):
                self._add(name, j, (M,), target=("bnp", j), space=space, count=M, inner=1, width=bits,
                          elem_bits=bits, elems_per_word=1, signed=sgn)
            self._add("e_beta", j, (), target=("bnp", j), space=SPACE_E, count=1, inner=1, width=E_WIDTH,
                      elem_bits=E_WIDTH, elems_per_word=1, signed=True)
        top = self.layers[-1]
        nl, ng = self.loss_lanes, self.loss_groups
        self._add("logits", top.index, (self.batch, top.n_out), target=("logits",), space=0,
                  count=self.batch * ng, inner=1, width=nl * self.logit_width,
                  elem_bits=self.logit_width, elems_per_word=nl,
                  pad=(self.batch, ng * nl), reshape=(self.batch * ng * nl,),
                  transpose=(0,), signed=True, access="ro")

        # infer: the predicted class of every sample, written into the labels memory (the batch's labels are not
        # needed after an infer); rows past the uploaded samples hold stale classes
        self._add("classes", None, (self.batch,), target=("labels",), space=0, count=self.batch, inner=1,
                  width=self.label_bits, elem_bits=self.label_bits, elems_per_word=1, access="ro")

        n_ph = len(self.phases()) + len(self.infer_phases())  # the step's phases, then infer's
        self._add("phase_cycles", None, (n_ph,), target=("plog",), space=0, count=n_ph, inner=1, width=32,
                  elem_bits=32, elems_per_word=1, access="ro")

    @property
    def logit_width(self) -> int:
        """Bits of a logit in the logits buffer: a training or an eval logit (``OutputGeometry.out_width``)."""
        return OutputGeometry.from_config(self.cfg, lanes=self.loss_lanes).out_width

    def quantity(self, name: str, layer: int) -> HostQuantity:
        for hq in self.quantities:
            if hq.layout.name == name and hq.layout.layer == layer:
                return hq
        raise KeyError((name, layer))

    @property
    def targets(self) -> list[tuple]:
        out = []
        for hq in self.quantities:
            if hq.target not in out:
                out.append(hq.target)
        return out

    # -- batch format ---------------------------------------------------------------------------------------

    @property
    def batch_layout(self) -> QuantityLayout:
        lp = self.layers[0]
        w = lp.words * lp.lanes_in
        return QuantityLayout("x", None, 0, (self.batch, self.features), 1, lp.lanes_in, pad=(self.batch, w),
                              reshape=(self.batch, w), transpose=(0, 1), encoding="sign")

    @property
    def label_layout(self) -> QuantityLayout:
        return QuantityLayout("labels", None, 0, (self.batch,), self.label_bits, 1, pad=(self.batch,),
                              reshape=(self.batch,), transpose=(0,))

    @property
    def loss_bits(self) -> int:
        """Width of the loss unit's integer loss (registers ``loss`` and, past 32 bits, ``loss_hi``)."""
        return OutputGeometry.from_config(self.cfg, lanes=self.loss_lanes).loss_q_width

    @property
    def regmap(self):
        return self._regmap(self.desc_hash)

    def _regmap(self, desc_hash: int):
        return build_regmap(name=self.name, layers=len(self.layers), batch=self.batch, classes=self.classes,
                            input_int8=self.input_kind == "int8", optimizer=self.cfg.hw.optimizer,
                            quantity_kinds=max(len(self.kinds), 2), loss_bits=self.loss_bits, desc_hash=desc_hash)

    @property
    def desc_hash(self) -> int:
        """The ``id_hash`` register's value: :func:`rtl_gen.contract.description_hash` of :meth:`description` (which
        leaves the register's own value out, so the description with the map built with 0 gives it)."""
        if getattr(self, "_desc_hash", None) is None:
            self._desc_hash = description_hash(self._description(self._regmap(0)))
        return self._desc_hash

    def description(self) -> AcceleratorDescription:
        return self._description(self.regmap)

    def _description(self, regmap) -> AcceleratorDescription:
        h = self.cfg.hw
        sched = {
            "optimizer": h.optimizer, "lr0": float(self.cfg.lr), "switch_lambda": h.switch_lambda,
            "switch_cutoff": h.switch_cutoff, "switch_sigma": h.switch_sigma,
            "switch_anneal": h.switch_anneal, "switch_rate": h.switch_rate,
            "bop_shift": h.bop_shift, "iir_alpha_shift": h.iir_alpha_shift,
            "iir_max_decay_shift": h.iir_max_decay_shift, "alpha_decay": self.cfg.optimizer.iir.alpha_decay,
            "decay_factor": self.cfg.optimizer.iir.decay_factor, "decay_every": self.cfg.optimizer.iir.decay_every,
            "epochs": self.cfg.train.epochs, "arith": dict(vars(self.p)),
        }  # fmt: skip
        return AcceleratorDescription(
            name=self.name, regmap=regmap, batch=self.batch, classes=self.classes, input=self.input_kind,
            features=self.features, layers=[(lp.n_in, lp.n_out) for lp in self.layers],
            batch_layout=self.batch_layout, label_layout=self.label_layout,
            quantities=[hq.layout for hq in self.quantities], kinds=dict(self.kinds), schedule=sched,
            config=self.cfg.to_toml(),
        )
