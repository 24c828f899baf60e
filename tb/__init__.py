"""cocotb testbenches of the generated hardware (one module per unit, ``system_tb`` for the whole accelerator through
the host driver). They sit above every layer they check: the generator (rtl_gen), the golden models (sim) and the
host driver (host); see docs/architecture.md, "Layers". Not installed: they run from a checkout (``make test``)."""
