"""Shared test setup. The toolchain fixes (PATH, MAKEFLAGS, Yosys choice) apply to every test."""

from rtl_gen.toolchain import setup_environment

setup_environment()
