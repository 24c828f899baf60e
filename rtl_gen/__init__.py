"""Amaranth generators for the BNN training accelerator, and the toolchain glue that exports and checks them."""
