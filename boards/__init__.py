"""Board definitions (ZedBoard, PYNQ-Z1/Z2, open-toolchain boards) and build flows."""
