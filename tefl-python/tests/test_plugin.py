"""TE-FL's plugin API on tefl: the plugin README's in-tree example, an out-of-tree Python plugin
package loaded through TE_FL_PLUGIN_MODULES, and Python impls in selection, fallback, failure
memory, counters and explain like Rust impls."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tefl.plugin.core import BackendImplKind, OpImpl, OpManager, OpRegistry

HERE = pathlib.Path(__file__).parent


def run(script_args, **env):
    # The checks read INFO log lines: the caller's own TEFL_LOG_LEVEL must not hide them.
    e = dict(os.environ, TEFL_LOG_LEVEL="INFO")
    e.update(env)
    e["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "plugins"), e.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, *script_args], capture_output=True, text=True, env=e, timeout=120)


def test_the_in_tree_example_runs_and_prints_the_seed_log_lines():
    r = run([str(HERE / "examples" / "run_intree.py")])
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert any("Registered impl_ids: [" in l and "'vendor.mybackend'" in l for l in lines), r.stderr
    assert any("Op 'rmsnorm_fwd' using 'vendor.mybackend' (kind=vendor, vendor=mybackend)" in l for l in lines), r.stderr


def test_an_out_of_tree_plugin_package_is_loaded_from_te_fl_plugin_modules():
    code = (
        "import numpy as np, tefl.tex as tex, acme_tefl_plugin as acme\n"
        "x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)\n"
        "y = tex.gelu(x, None)\n"
        "s1 = tex.silu(x, None); s2 = tex.silu(x, None)\n"
        "want = x / (1 + np.exp(-x.astype(np.float64)))\n"
        "assert np.abs(s1 - want).max() < 1e-5 and np.abs(s2 - want).max() < 1e-5\n"
        "print('calls', acme.CALLS['gelu'], acme.CALLS['silu'])\n"
    )
    r = run(["-c", code], TE_FL_PLUGIN_MODULES="acme_tefl_plugin")
    assert r.returncode == 0, r.stdout + r.stderr
    # gelu served by the plugin; silu tried once, failed, fell back, and was not tried again.
    assert "calls 1 1" in r.stdout, r.stdout
    assert "Op 'gelu' using 'vendor.acme' (kind=vendor, vendor=acme)" in r.stderr, r.stderr
    assert "Implementation 'vendor.acme' failed for op 'silu'" in r.stderr and "acme silu kernel is broken" in r.stderr
    assert "Op 'silu' fallback to 'reference.cpu'" in r.stderr, r.stderr
    # The Python module is not also opened as a C library.
    assert "skipped" not in r.stderr, r.stderr
    # The last "Registered impl_ids" line (after the plugin modules) lists the plugin's impl
    # with the built-in ones.
    registered = [l for l in r.stderr.splitlines() if "Registered impl_ids: [" in l]
    assert registered and "'vendor.acme'" in registered[-1] and "'reference.cpu'" in registered[-1], r.stderr


def relu_with_plugins(entries):
    """Runs a tex.relu call in a fresh process with TE_FL_PLUGIN_MODULES=`entries` (the call must
    still succeed); returns {entry: its 'skipped' log line} for the entries that were skipped."""
    r = run(["-c", "import numpy as np, tefl.tex as tex; print(tex.relu(np.ones((2, 2), np.float32), None).sum())"],
            TE_FL_PLUGIN_MODULES=entries)
    assert r.returncode == 0 and "4.0" in r.stdout, r.stdout + r.stderr
    skipped = {}
    for entry in entries.split(","):
        lines = [l for l in r.stderr.splitlines() if f"Plugin '{entry}' skipped" in l]
        if lines:
            skipped[entry] = lines[0]
    return skipped


def test_a_broken_plugin_module_is_reported_and_skipped():
    line = relu_with_plugins("json")["json"]
    assert "register" in line, line


def test_a_plugin_name_that_is_neither_a_module_nor_a_library_says_so():
    line = relu_with_plugins("no_such_tefl_plugin")["no_such_tefl_plugin"]
    assert "not a Python module" in line and "nor a library" in line, line


def test_a_dotted_name_with_so_in_it_is_a_name_and_a_versioned_library_is_a_path():
    # One rule in the native loader and in the Python package: "pkg.sockets" is a bare name (a
    # Python module or libpkg.sockets.so), "libx.so.1" a library file.
    skipped = relu_with_plugins("no_such_pkg.sockets,./no_such_libx.so.1")
    name, path = skipped["no_such_pkg.sockets"], skipped["./no_such_libx.so.1"]
    assert "not a Python module" in name and "libno_such_pkg.sockets.so" in name, name
    assert "not a Python module" not in path and "cannot load ./no_such_libx.so.1" in path, path


def make_manager(fn, op="rmsnorm_fwd", priority=200, kind=BackendImplKind.VENDOR):
    registry = OpRegistry()
    registry.register_impl(OpImpl(op_name=op, impl_id="vendor.pytest", kind=kind, vendor="pytest", fn=fn, priority=priority))
    return OpManager(registry)


def test_a_python_impl_gets_the_callers_memory_and_is_counted():
    seen = {}

    def impl(x, gamma, eps=1e-5, **kwargs):
        seen["x"] = x
        seen["kwargs"] = sorted(kwargs)
        r = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(-1) + eps)
        return (x * r[:, None] * gamma).astype(np.float32), r.astype(np.float32)

    m = make_manager(impl)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    g = np.ones(16, np.float32)
    y, rs = m.call("rmsnorm_fwd", x, g)
    assert np.shares_memory(seen["x"], x), "the impl should see the caller's array, not a copy"
    assert seen["kwargs"] == ["out_dtype", "zero_centered_gamma"]
    assert y.shape == (3, 16) and rs.shape == (3,)
    assert m.counters()[("rmsnorm_fwd", "vendor.pytest")][0] == 1
    assert "vendor.pytest" in m.explain("rmsnorm_fwd", "cpu", "f32")
    assert "vendor.pytest" in m.impl_ids()


def test_a_python_impl_that_raises_falls_back_and_is_remembered():
    calls = []

    def broken(x, gamma, **kwargs):
        calls.append(1)
        raise ZeroDivisionError("bad vendor kernel")

    m = make_manager(broken)
    x, g = np.ones((2, 8), np.float32), np.ones(8, np.float32)
    y, _ = m.call("rmsnorm_fwd", x, g)
    assert np.allclose(y, 1.0, atol=1e-4)
    m.call("rmsnorm_fwd", x, g)
    assert len(calls) == 1, "a failed impl is passed over for a while"
    ok, failures, _ = m.counters()[("rmsnorm_fwd", "vendor.pytest")]
    assert (ok, failures) == (0, 1)


def test_a_python_impl_out_of_memory_falls_back_and_is_tried_again():
    # MemoryError, or torch's OutOfMemoryError (matched by class name: torch is not needed),
    # says how big the call was, not that the impl is broken: fallback on every call, no
    # passing over, and the failures still counted.
    class OutOfMemoryError(RuntimeError):
        pass

    for exc in (MemoryError("host pool exhausted"), OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")):
        calls = []

        def hungry(x, gamma, exc=exc, **kwargs):
            calls.append(1)
            raise exc

        m = make_manager(hungry)
        x, g = np.ones((2, 8), np.float32), np.ones(8, np.float32)
        for _ in range(3):
            y, _ = m.call("rmsnorm_fwd", x, g)
            assert np.allclose(y, 1.0, atol=1e-4)
        assert len(calls) == 3, f"{type(exc).__name__}: an impl out of memory is tried again"
        ok, failures, _ = m.counters()[("rmsnorm_fwd", "vendor.pytest")]
        assert (ok, failures) == (0, 3)


def test_a_call_whose_only_impl_ran_out_of_memory_raises_tefl_out_of_memory_error():
    r = run(["-c", (
        "import numpy as np, tefl\n"
        "from tefl.plugin.core import *\n"
        "def hungry(x, **k):\n"
        "    raise MemoryError('no room for the relu workspace')\n"
        "reg = OpRegistry()\n"
        "reg.register_impl(OpImpl(op_name='relu', impl_id='vendor.hungry', kind=BackendImplKind.VENDOR, vendor='hungry', fn=hungry, priority=9))\n"
        "m = OpManager(reg)\n"
        "try:\n"
        "    m.call('relu', np.ones(4, np.float32))\n"
        "except tefl.OutOfMemoryError as e:\n"
        "    print('OutOfMemoryError:', e)\n"
    )], TE_FL_PER_OP="relu=vendor:hungry")
    assert "OutOfMemoryError:" in r.stdout, r.stdout + r.stderr
    assert "impl 'vendor.hungry' of op 'relu'" in r.stdout and "no room for the relu workspace" in r.stdout, r.stdout


def test_strict_mode_raises_the_impl_failure_naming_it():
    def broken(x, gamma, **kwargs):
        raise ValueError("nope")

    r = run(["-c", (
        "import numpy as np\n"
        "from tefl.plugin.core import *\n"
        "reg = OpRegistry()\n"
        "reg.register_impl(OpImpl(op_name='relu', impl_id='vendor.strict', kind=BackendImplKind.VENDOR, vendor='strict', fn=lambda x, **k: 1/0, priority=9))\n"
        "m = OpManager(reg)\n"
        "try:\n"
        "    m.call('relu', np.ones(4, np.float32))\n"
        "except RuntimeError as e:\n"
        "    print('RuntimeError:', e)\n"
    )], TE_FL_STRICT="1")
    assert "RuntimeError:" in r.stdout and "vendor.strict" in r.stdout and "ZeroDivisionError" in r.stdout, r.stdout + r.stderr


def test_registration_errors_name_the_culprit():
    registry = OpRegistry()
    with pytest.raises(TypeError, match="OpImpl"):
        registry.register_impl("not an impl")
    registry.register_impl(OpImpl(op_name="rmsnorm_fwdd", impl_id="vendor.x", kind=BackendImplKind.VENDOR, fn=print))
    with pytest.raises(ValueError, match="rmsnorm_fwdd.*did you mean rmsnorm_fwd"):
        OpManager(registry)
    registry = OpRegistry()
    registry.register_impl(OpImpl(op_name="relu", impl_id="vendor.x", kind="sideways", fn=print))
    with pytest.raises(ValueError, match="sideways"):
        OpManager(registry)


def test_a_wrong_output_from_a_python_impl_is_a_failure_not_a_crash():
    m = make_manager(lambda x, **k: "not a tensor", op="relu")
    y = m.call("relu", -np.ones(5, np.float32))
    assert np.array_equal(y, np.zeros(5, np.float32))
    m = make_manager(lambda x, **k: np.ones(3, np.float32), op="relu")
    y = m.call("relu", -np.ones(5, np.float32))
    assert np.array_equal(y, np.zeros(5, np.float32)), "a wrongly shaped output falls back to the reference"
