"""host.simboard: the accelerator simulated without cocotb (Verilator model + C++ bus harness via ctypes),
driven by the real host.driver.Driver, against the bit-exact model sim.hw.model.HwModel."""

import time

import numpy as np
import pytest
from small_mlp import SMALL  # the small MLP of the system tests (tests/small_mlp.py)

from host.driver import Driver
from host.errors import AcceleratorError, HardwareMismatch, TransferTimeout
from rtl_gen.contract import description_hash
from sim.config import apply_overrides, load_config


def _batches(cfg, steps):
    from sim.datasets import load_dataset
    from sim.hw.engine import prepare_inputs

    ds = load_dataset(cfg.data.dataset, cfg.data.path or None)
    B = cfg.train.batch_size
    idx = np.random.default_rng(cfg.train.seed).permutation(len(ds.x_train))[:B * steps]
    x = prepare_inputs(cfg, ds.x_train[idx])
    y = ds.y_train[idx]
    return [(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B]) for i in range(steps)]


def _differences(got, want):
    """Keys of ``want`` whose arrays differ in ``got`` (missing keys included)."""
    return [k for k in sorted(want) if k not in got or not np.array_equal(np.asarray(got[k]), np.asarray(want[k]))]


def _train_and_compare(board, cfg, steps):
    """Restore the model's power-on state, run ``steps`` training steps through the driver and the model and
    compare the whole state, the loss, the correct count and the logits after every step; returns s/step."""
    from sim.hw.model import HwModel

    drv = Driver(board.description, board.transport)
    model = HwModel(cfg)
    drv.load_state_dict(model.state_dict())
    assert _differences(drv.state_dict(), model.state_dict()) == []
    walls = []
    for s, (x, y) in enumerate(_batches(cfg, steps)):
        c0, t0 = board.cycles, time.perf_counter()
        res = drv.train_step(x, y, lr=cfg.lr)
        walls.append(time.perf_counter() - t0)
        assert board.cycles - c0 >= res.cycles > 0
        trace = model.train_step(x, y, lr=cfg.lr)
        assert _differences(drv.state_dict(), model.state_dict()) == [], f"step {s}"
        assert (res.loss, res.correct, res.undone) == (trace.loss, trace.correct, trace.undone), f"step {s}"
        assert np.array_equal(res.logits, trace.logits_q), f"step {s}"
    return walls


@pytest.fixture(scope="module")
def small():
    from host.simboard import SimBoard

    cfg = apply_overrides(load_config("mlp"), SMALL)
    lines = []
    with SimBoard.build(cfg, log=lines.append) as board:
        yield cfg, board, lines


@pytest.mark.rtl
def test_whole_steps_equal_the_bit_exact_model(small):
    cfg, board, _ = small
    _train_and_compare(board, cfg, 3)


@pytest.mark.rtl
def test_the_verilog_holds_the_description_hash_and_refuses_another_description(small):
    from rtl_gen.top import SystemPlan

    cfg, board, _ = small
    desc = board.description
    word = board.transport.read(desc.regmap.addr("id_hash"))  # the generated Verilog's register
    assert word == description_hash(desc) == SystemPlan(cfg).desc_hash != 0
    # another configuration with the same identification fields (layers, classes, batch, input, optimiser)
    other_cfg = apply_overrides(load_config("mlp"), SMALL + ['model.layers=[{type="dense",units=16},'
                                                             '{type="dense",units=10}]'])
    other = SystemPlan(other_cfg).description()
    with pytest.raises(HardwareMismatch, match=rf"description hash \(id_hash\): accelerator.json "
                                               rf"{description_hash(other):#010x}, hardware {word:#010x}") as e:
        Driver(other, board.transport)
    assert len(e.value.fields) == 1  # only the hash tells the two apart


@pytest.mark.rtl
def test_infer_equals_the_model_and_leaves_the_state(small):
    cfg, board, _ = small
    _train_and_compare(board, cfg, 1)
    _infer_and_compare(board, cfg)


@pytest.mark.rtl
def test_state_restore_round_trip(small):
    """Checkpoint, train two steps, restore the checkpoint, train the same two steps: identical states."""
    cfg, board, _ = small
    from sim.hw.model import HwModel

    drv = Driver(board.description, board.transport)
    drv.load_state_dict(HwModel(cfg).state_dict())
    b = _batches(cfg, 3)
    drv.train_step(*b[0], lr=cfg.lr)
    checkpoint = drv.state_dict()
    first = [drv.train_step(x, y, lr=cfg.lr).loss for x, y in b[1:]]
    after = drv.state_dict()
    drv.load_state_dict(checkpoint)
    assert _differences(drv.state_dict(), checkpoint) == []
    again = [drv.train_step(x, y, lr=cfg.lr).loss for x, y in b[1:]]
    assert again == first
    assert _differences(drv.state_dict(), after) == []
    assert _differences(after, checkpoint) != []  # the two steps changed something


@pytest.mark.rtl
def test_streams_that_do_not_complete_raise_and_the_board_recovers(small):
    """A receive with no command running waits at most ``max_idle`` cycles and raises TransferTimeout; a
    receive of more words than a readback sends ends at its TLAST and raises; the board works afterwards."""
    cfg, board, _ = small
    from host.transports.simboard import SimTransport

    drv = Driver(board.description, board.transport)
    short = SimTransport(board, max_idle=500)
    c0 = board.cycles
    with pytest.raises(TransferTimeout, match="stream receive of 8 words: 0 came, then none for 500 cycles"):
        short.receive(8)
    assert 500 <= board.cycles - c0 < 600
    q = board.description.quantity("w", 0)
    board.transport.execute(drv._command("readback", layer=0, quantity=q.kind))
    with pytest.raises(AcceleratorError, match=f"stream receive of {q.beats + 5} words: the stream ended "
                                               rf"\(TLAST\) after {q.beats} words"):
        short.receive(q.beats + 5)
    drv.abort()
    assert drv.status()["status"]["busy"] == 0
    _train_and_compare(board, cfg, 1)


@pytest.mark.rtl
def test_the_second_build_is_a_cache_hit(small):
    cfg, board, lines = small
    from host.simboard import build_library
    from rtl_gen.top import Accelerator, SystemPlan

    plan = SystemPlan(cfg)
    verilog = Accelerator(plan).verilog()
    log = []
    t0 = time.monotonic()
    lib, built = build_library(verilog, plan.name, log=log.append)
    assert (lib, built) == (board.library, False)
    assert log == [f"simulated board: reusing {lib.parent}"]
    assert time.monotonic() - t0 < 10  # no Verilator, no compiler
    assert any(line.startswith("simulated board: ") for line in lines)


def test_another_verilog_or_harness_gets_another_key(monkeypatch, tmp_path):
    from host import simboard

    a = simboard.library_key("module a; endmodule\n", "a")
    assert simboard.library_key("module a; endmodule\n", "a") == a
    assert simboard.library_key("module a; wire w; endmodule\n", "a")["verilog"] != a["verilog"]
    other = tmp_path / "simboard.cpp"
    other.write_text(simboard.HARNESS.read_text() + "\n// changed\n")
    monkeypatch.setattr(simboard, "HARNESS", other)
    assert simboard.library_key("module a; endmodule\n", "a")["harness"] != a["harness"]


def test_a_missing_compiler_is_named(monkeypatch):
    from host import simboard

    real = simboard.shutil.which
    monkeypatch.setattr(simboard.shutil, "which", lambda name: None if name == "g++" else real(name))
    with pytest.raises(simboard.SimBoardBuildError, match=r"needs `g\+\+` to compile its simulator"):
        simboard.build_library("module a; endmodule\n", "a")


@pytest.mark.paper
def test_paper_mlp_three_steps_on_the_simulated_board():
    """The paper's MLP (configs/mlp_mnist.toml as it is): 3 training steps through the driver on the simulated
    board, every read-back quantity equal to the bit-exact model after every step; prints seconds per step."""
    from host.simboard import SimBoard
    from sim.config import CONFIG_DIR

    cfg = load_config(CONFIG_DIR / "mlp_mnist.toml")
    with SimBoard.build(cfg, log=print) as board:
        walls = _train_and_compare(board, cfg, 3)
        print(f"paper MLP on the simulated board: {', '.join(f'{w:.2f}' for w in walls)} s per step "
              f"({board.cycles:,} cycles simulated)")
        _infer_and_compare(board, cfg)


def _infer_and_compare(board, cfg):
    """After training: ``infer`` of a full batch and of a partial one (49 samples) equals the bit-exact model's
    evaluation forward pass (classes and logits), costs the cycle model's cycles, and leaves the state as it was."""
    from rtl_gen.cycle_model import infer_cycles
    from rtl_gen.top import SystemPlan
    from sim.hw.model import HwModel

    drv = Driver(board.description, board.transport)
    model = HwModel(cfg)
    state = drv.state_dict()
    model.load_state_dict(state)
    (x, _), = _batches(apply_overrides(cfg, ["train.seed=7"]), 1)
    for n in (cfg.train.batch_size, 49):
        classes, logits = drv.infer(x[:n], logits=True)
        want = model.forward_eval(x[:n])
        assert np.array_equal(logits, want) and np.array_equal(classes, np.argmax(want, axis=1)), n
        assert drv.last_infer_cycles == infer_cycles(SystemPlan(cfg)), n
    assert _differences(drv.state_dict(), state) == []


def test_the_wrapper_keeps_the_ports_and_registers_the_reset():
    from host.simboard import WRAPPER, SimBoardBuildError, wrap_top

    top = ("module acc(clk, rst, a, y);\n  input clk;\n  input rst;\n  input [11:0] a;\n  output [31:0] y;\n"
           "  assign y = a;\nendmodule\n")
    text = wrap_top(top, "acc")
    assert text.splitlines()[0] == f"module {WRAPPER}(clk, rst, a, y);"
    assert "  input [11:0] a;" in text and "  output [31:0] y;" in text and "  input clk;" in text
    assert "always @(posedge clk) rst_q <= rst;" in text
    assert "acc dut(.clk(clk), .rst(rst_q), .a(a), .y(y));" in text
    with pytest.raises(SimBoardBuildError, match="module acc: no port 'rst'"):
        wrap_top(top.replace("rst", "reset"), "acc")
    with pytest.raises(SimBoardBuildError, match="the Verilog has no module 'other'"):
        wrap_top(top, "other")


def test_code_built_for_this_processor_is_keyed_on_it(monkeypatch):
    """-march=native objects must not be reused on another kind of processor: the processor's digest goes into
    the compiler's flags (ccache's key) and so into the library's key; portable flags get no such define."""
    from host import simboard
    from rtl_gen import toolchain

    monkeypatch.setitem(toolchain.MODEL_OPT, "fast", "-O2 -march=native")
    here = simboard.library_key("module a; endmodule\n", "a")
    assert here["make"]["OPT_FAST"] == f"-O2 -march=native -DXNT_HOST_CPU={simboard._host_cpu()}"
    monkeypatch.setattr(simboard, "_host_cpu", lambda: "0123456789")
    assert simboard.library_key("module a; endmodule\n", "a")["make"]["OPT_FAST"].endswith("=0123456789")
    monkeypatch.setitem(toolchain.MODEL_OPT, "fast", "-O2")
    assert simboard.library_key("module a; endmodule\n", "a")["make"]["OPT_FAST"] == "-O2"


def test_the_verilog_cache_is_keyed_on_configuration_and_generator(monkeypatch):
    """SimBoard.build reuses elaborated Verilog only for the same hardware fields of the configuration and the same
    generator sources; a field only the host uses (the seed) keeps it."""
    import host.simboard as sb

    cfg = apply_overrides(load_config("mlp"), SMALL)
    a = sb.verilog_cache_path(cfg, "top")
    assert a == sb.verilog_cache_path(apply_overrides(load_config("mlp"), SMALL), "top")
    assert a != sb.verilog_cache_path(apply_overrides(cfg, ["hw.dx_passes=1"]), "top")
    assert a == sb.verilog_cache_path(apply_overrides(cfg, ["train.seed=3", "train.lr.initial=0.01"]), "top")
    monkeypatch.setattr(sb, "_generator_digest", lambda: "another generator")
    assert a != sb.verilog_cache_path(cfg, "top")
