"""Transports: what runs the driver's bus operations (:mod:`host.transports.base`) on the board
(:mod:`host.transports.pynq`) or the simulated board (:mod:`host.transports.simboard`)."""
