// Toggle-coverage access for the simulated board, compiled only into builds made with
// host/simboard.py's ``coverage=True`` (Verilator --coverage-toggle): the normal build never sees this file,
// so its cache key and speed stay as they are.
//
// The counters live in the VerilatedContext that the harness's sb_open() creates; constructing a context
// makes it the calling thread's context (verilated.h), so these functions act on the board opened last in
// this thread. host/simboard.py keeps one coverage board open at a time.

#include <string>

#include "verilated.h"
#include "verilated_cov.h"

extern "C" {

// 1 in a coverage build (the Python side checks for this symbol before calling the two below).
int sb_cov_enabled() { return 1; }

// Zero every coverage counter (e.g. after reset and the upload, right before the step to be measured).
void sb_cov_zero() { Verilated::threadContextp()->coveragep()->zero(); }

// Write every counter to ``path`` in Verilator's coverage.dat format.
void sb_cov_write(const char* path) { Verilated::threadContextp()->coveragep()->write(std::string(path)); }

}  // extern "C"
