"""kernels/ public API: dispatch, fallbacks, custom-op registration,
torch.compile, import robustness, Hopper compilation and the bench script.

Numerics of each kernel are in tests/test_kernels_<op>.py.  Triton kernels
run in the CPU interpreter: the fixture sets TRITON_INTERPRET=1 per test,
which works because kernels/ defines its @triton.jit functions lazily (read at
first launch) -- and keeps the setting from leaking into other test modules.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import kernels

REPO = Path(__file__).resolve().parents[1]
TOL = dict(rtol=1e-5, atol=2e-5)  # fp32 interpreter vs ATen, see the per-op files


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _run_python(code: str, env_updates=None, drop=("TRITON_INTERPRET",), args=(), timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.update(env_updates or {})
    cmd = [sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _op_inputs():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 24)
    w, b = torch.randn(24), torch.randn(24)
    q, k, v = (torch.randn(2, 3, 11, 16) for _ in range(3))
    logits, target = torch.randn(7, 30), torch.tensor([1, 2, -100, 4, 0, 29, 3])
    return SimpleNamespace(x=x, w=w, b=b, q=q, k=k, v=v, logits=logits, target=target)


# --- API surface ----------------------------------------------------------------


def test_ops_and_available_impls():
    assert kernels.OPS == ("layer_norm", "attention", "cross_entropy", "bias_gelu")
    impls = kernels.available_impls()
    assert set(kernels.OPS) <= set(impls)
    for op in kernels.OPS:
        assert callable(getattr(kernels, op))
        assert impls[op] == ("auto", "triton", "torch")  # triton is installed here


def test_invalid_impl_is_rejected():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="impl must be one of"):
        kernels.layer_norm(x, None, None, impl="cuda")


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_torch_and_cpu_auto_paths_are_the_builtin_ops(impl):
    t = _op_inputs()
    assert torch.equal(
        kernels.layer_norm(t.x, t.w, t.b, 1e-5, impl=impl), F.layer_norm(t.x, (24,), t.w, t.b, 1e-5)
    )
    assert torch.equal(
        kernels.attention(t.q, t.k, t.v, causal=True, impl=impl),
        F.scaled_dot_product_attention(t.q, t.k, t.v, is_causal=True),
    )
    assert torch.equal(
        kernels.cross_entropy(t.logits, t.target, 0.1, impl=impl),
        F.cross_entropy(t.logits, t.target, label_smoothing=0.1),
    )
    assert torch.equal(kernels.bias_gelu(t.x, t.b, impl=impl), F.gelu(t.x + t.b))
    w = torch.randn(30, 24)
    assert torch.equal(
        kernels.fused_linear_cross_entropy(t.x[0, :5], w, t.target[:5], impl=impl),
        F.cross_entropy(F.linear(t.x[0, :5], w), t.target[:5]),
    )


def _fake_cuda(*shape, dtype=torch.bfloat16):
    return SimpleNamespace(is_cuda=True, shape=shape, dtype=dtype, device=SimpleNamespace(index=0))


def _fake_table(tmp_path, entries):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"entries": entries}))
    return path


def test_auto_on_cuda_uses_triton_only_where_the_table_records_a_win(tmp_path, monkeypatch):
    entries = [
        {"gpu": "Fake GPU X1", "op": "layer_norm", "dtype": "bf16", "bucket": "n4096", "impl": "triton"},
        {"gpu": "Fake GPU X1", "op": "layer_norm", "dtype": "bf16", "bucket": "n1024", "impl": "torch"},
        {
            "gpu": "Fake GPU X1",
            "op": "attention",
            "dtype": "bf16",
            "bucket": "d64-s1024-causal",
            "impl": "triton",
        },
        {"gpu": "Fake GPU X1", "op": "cross_entropy", "dtype": "bf16", "bucket": "v65536", "impl": "triton"},
    ]
    monkeypatch.setenv("KERNELS_DISPATCH_TABLE", str(_fake_table(tmp_path, entries)))
    monkeypatch.setattr(kernels.dispatch, "gpu_name", lambda index: "Fake GPU X1")
    resolve = kernels.resolve
    x = _fake_cuda(8, 3000)  # 3000 rounds up to the measured 4096 bucket
    assert resolve("layer_norm", "auto", x, dim=3000) == "triton"
    assert resolve("layer_norm", "auto", _fake_cuda(8, 768), dim=768) == "torch"  # measured: torch won
    assert resolve("layer_norm", "auto", _fake_cuda(8, 8192), dim=8192) == "torch"  # not measured
    assert resolve("layer_norm", "auto", _fake_cuda(8, 3000, dtype=torch.float32), dim=3000) == "torch"
    q = _fake_cuda(8, 12, 1000, 64)
    assert resolve("attention", "auto", q, q, q, head_dim=64, seq=1000, causal=True) == "triton"
    assert resolve("attention", "auto", q, q, q, head_dim=64, seq=1000, causal=False) == "torch"
    logits = _fake_cuda(16384, 50257)
    assert resolve("cross_entropy", "auto", logits, vocab=50257) == "triton"
    assert resolve("bias_gelu", "auto", x, x, dim=3000) == "torch"  # op not in the table
    # the same table on another GPU, and CPU tensors, keep the built-in ops
    monkeypatch.setattr(kernels.dispatch, "gpu_name", lambda index: "Fake GPU Y2")
    assert resolve("layer_norm", "auto", x, dim=3000) == "torch"
    cpu = SimpleNamespace(is_cuda=False, shape=(8, 3000), dtype=torch.bfloat16)
    assert resolve("layer_norm", "auto", cpu, dim=3000) == "torch"


def test_auto_without_a_table_is_the_builtin_path(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNELS_DISPATCH_TABLE", str(tmp_path / "missing.json"))
    monkeypatch.setattr(kernels.dispatch, "gpu_name", lambda index: "Fake GPU X1")
    for op, dims in (
        ("layer_norm", dict(dim=768)),
        ("bias_gelu", dict(dim=3072)),
        ("cross_entropy", dict(vocab=50257)),
        ("attention", dict(head_dim=64, seq=197, causal=False)),
    ):
        assert kernels.resolve(op, "auto", _fake_cuda(8, 768), **dims) == "torch"


def test_committed_table_is_well_formed():
    # Every entry names a known op, dtype and a bucket that shape_bucket can produce.
    table = json.loads((REPO / "kernels" / "dispatch_table.json").read_text())
    for e in table["entries"]:
        assert e["op"] in kernels.OPS + kernels.EXTRA_OPS and e["impl"] in ("triton", "torch")
        assert e["dtype"] in kernels.dispatch.DTYPE_NAMES.values() and e["gpu"]
        assert e["bucket"] == kernels.dispatch.shape_bucket(e["op"], **e["dims"]), e


# --- custom ops and torch.compile -------------------------------------------


def _custom_op_cases():
    ln, at, ce, mlp = (
        sys.modules[f"kernels.{m}"] for m in ("layer_norm", "attention", "cross_entropy", "mlp")
    )
    t = _op_inputs()
    x2 = t.x.reshape(-1, 24)
    o, lse = at.attention_fwd(t.q, t.k, t.v, True, 0.25)
    _, ce_lse = ce.cross_entropy_fwd(t.logits, t.target, 0.1, -100, 30)
    hidden, weight = torch.randn(7, 16), torch.randn(30, 16)
    return [
        (ln.layer_norm_fwd, (x2, t.w, t.b, 1e-5)),
        (ln.layer_norm_bwd, (x2, x2, t.w, torch.randn(10), torch.rand(10))),
        (at.attention_fwd, (t.q, t.k, t.v, False, 0.25)),
        (at.attention_bwd, (t.q, t.q, t.k, t.v, o, lse, True, 0.25)),
        (ce.cross_entropy_fwd, (t.logits, t.target, 0.1, -100, 30)),
        (ce.cross_entropy_fwd, (t.logits, t.target.clamp(max=24), 0.0, -100, 25)),  # 5 padding columns
        (ce.cross_entropy_bwd, (torch.tensor(2.0), t.logits, t.target, ce_lse, 0.1, -100, 30)),
        (ce.cross_entropy_bwd, (torch.tensor(2.0), t.logits, t.target.clamp(max=24), ce_lse, 0.1, -100, 25)),
        (ce.cross_entropy_fwd_inplace, (t.logits.clone(), t.target.clamp(max=24), 0.1, -100, 25)),
        (ce.scale_, (torch.randn(5, 3), torch.tensor(2.0))),
        (ce.fused_linear_cross_entropy_fwd, (hidden, weight, t.target, torch.randn(30), 0.1, -100, 3)),
        (ce.fused_linear_cross_entropy_fwd, (hidden, weight, t.target, None, 0.0, -100, 3)),
        (mlp.bias_gelu_fwd, (x2, t.b)),
        (mlp.bias_gelu_bwd, (x2, x2, t.b)),
        (mlp.swiglu_fwd, (x2, x2)),
        (mlp.swiglu_bwd, (x2, x2, x2)),
    ]


def test_custom_ops_pass_opcheck(interpret):
    # Schema, fake (meta) kernels vs real outputs, and AOT dispatch: what
    # torch.compile relies on.
    cases = _custom_op_cases()
    assert len({op._qualname for op, _ in cases}) == 13
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def _model_step(x, w, b, q, k, v, target):
    h = kernels.layer_norm(x, w, b, impl="triton")
    h = kernels.bias_gelu(h, b, impl="triton")
    a = kernels.attention(q, k, v, causal=True, impl="triton")
    loss = kernels.cross_entropy(h.reshape(-1, h.shape[-1]), target, 0.1, impl="triton")
    return loss + a.square().mean()


def test_torch_compile_full_graph_matches_eager(interpret):
    # aot_eager traces the same graph inductor does (dynamo + AOTAutograd with
    # the custom ops' fake kernels) without generating C++; inductor itself is
    # covered for layer_norm below.
    torch.manual_seed(1)
    x = torch.randn(2, 3, 20, requires_grad=True)
    w, b = torch.randn(20, requires_grad=True), torch.randn(20, requires_grad=True)
    q, k, v = (torch.randn(1, 2, 9, 16, requires_grad=True) for _ in range(3))
    target = torch.randint(0, 20, (6,))
    inputs = (x, w, b, q, k, v)
    torch.compiler.reset()
    compiled = torch.compile(_model_step, backend="aot_eager", fullgraph=True)
    out = compiled(*inputs, target)
    grads = torch.autograd.grad(out, inputs)
    ref = _model_step(*inputs, target)
    ref_grads = torch.autograd.grad(ref, inputs)
    torch.testing.assert_close(out, ref, **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


def test_torch_compile_inductor_layer_norm(interpret):
    torch.manual_seed(2)
    x = torch.randn(4, 7, 24, requires_grad=True)
    w, b = torch.randn(24, requires_grad=True), torch.randn(24, requires_grad=True)

    def fn(x, w, b):
        return kernels.layer_norm(x * 2.0, w, b, impl="triton").relu()

    torch.compiler.reset()
    compiled = torch.compile(fn, fullgraph=True)  # default backend: inductor
    out = compiled(x, w, b)
    dy = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, w, b), dy)
    ref = fn(x, w, b)
    ref_grads = torch.autograd.grad(ref, (x, w, b), dy)
    assert type(ref.grad_fn).__name__ == "ReluBackward0"
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(ref, F.layer_norm(x * 2.0, (24,), w, b).relu(), **TOL)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **TOL)


# --- import robustness (subprocesses) ---------------------------------------


def test_triton_impl_on_cpu_without_interpreter_raises_then_lazy_interpreter_works():
    proc = _run_python("""
        import os, torch, kernels
        assert "TRITON_INTERPRET" not in os.environ
        t = dict(x=torch.randn(3, 8), q=torch.randn(1, 1, 4, 16))
        calls = {
            "layer_norm": lambda: kernels.layer_norm(t["x"], None, None, impl="triton"),
            "attention": lambda: kernels.attention(t["q"], t["q"], t["q"], impl="triton"),
            "cross_entropy": lambda: kernels.cross_entropy(t["x"], torch.zeros(3, dtype=torch.long),
                                                           impl="triton"),
            "bias_gelu": lambda: kernels.bias_gelu(t["x"], torch.zeros(8), impl="triton"),
        }
        for op, call in calls.items():
            try:
                call()
            except RuntimeError as e:
                assert str(e) == (f"kernels: the triton implementation of {op} needs a CUDA tensor "
                                  "(or TRITON_INTERPRET=1 on CPU)"), str(e)
            else:
                raise AssertionError(f"{op}: no error")
        # kernels (and triton) are already imported; the interpreter still
        # engages because the jit functions are defined at first launch.
        os.environ["TRITON_INTERPRET"] = "1"
        y = kernels.layer_norm(t["x"], None, None, impl="triton")
        torch.testing.assert_close(y, torch.nn.functional.layer_norm(t["x"], (8,)), rtol=1e-5, atol=1e-5)
        print("OK")
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_imports_and_falls_back_without_triton():
    proc = _run_python(
        """
        import sys
        sys.modules["triton"] = None  # make `import triton` fail
        import torch, kernels
        assert not kernels.HAS_TRITON
        assert kernels.available_impls()["attention"] == ("auto", "torch")
        x = torch.randn(3, 8)
        assert torch.equal(kernels.layer_norm(x, None, None), torch.nn.functional.layer_norm(x, (8,)))
        try:
            kernels.layer_norm(x, None, None, impl="triton")
        except RuntimeError as e:
            assert "needs the 'triton' package" in str(e), str(e)
        else:
            raise AssertionError("no error")
        print("OK")
    """,
        env_updates={"TRITON_INTERPRET": "1"},
        drop=(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_kernels_does_not_import_project_packages():
    for path in (REPO / "kernels").glob("*.py"):
        source = path.read_text()
        assert "orchestrator" not in source and "workers" not in source, path


# --- GPU compilation without a GPU ------------------------------------------


def test_every_kernel_compiles_for_hopper():
    # The interpreter is lenient; this runs the real compiler (down to cubin
    # for sm_90) on every kernel, with the first autotune config, in bf16.
    proc = _run_python(None, args=["-m", "kernels._compile_check", "--quick", "--json"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    names = {r["kernel"] for r in records}
    assert names == {
        "layer_norm_fwd_kernel",
        "layer_norm_bwd_kernel",
        "attn_fwd_kernel",
        "attn_bwd_preprocess_kernel",
        "attn_bwd_dkdv_kernel",
        "attn_bwd_dq_kernel",
        "cross_entropy_fwd_kernel",
        "cross_entropy_bwd_kernel",
        "bias_gelu_fwd_kernel",
        "bias_gelu_bwd_kernel",
        "swiglu_fwd_kernel",
        "swiglu_bwd_kernel",
        "scale_kernel",
    }
    assert all(r["dtype"] == "torch.bfloat16" and r["fits_hopper_smem"] for r in records)


# --- bench/kernels.py ---------------------------------------------------------


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_kernels", REPO / "bench" / "kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_help_and_no_gpu_message():
    proc = _run_python(None, args=["bench/kernels.py", "--help"])
    assert proc.returncode == 0 and "--quick" in proc.stdout
    proc = _run_python(None, args=["bench/kernels.py", "--quick"], env_updates={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "no CUDA device; kernel benchmarks need a GPU"


def test_bench_report_helpers(tmp_path):
    bench = _bench_module()
    assert bench.parse_args(["--quick", "--ops", "attention"]).ops == ["attention"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--ops", "softmax"])
    json_path, md_path = bench.result_paths(tmp_path, "NVIDIA H100 80GB HBM3", "2025-01-02")
    assert json_path.name == "kernels-nvidia-h100-80gb-hbm3-2025-01-02.json" and md_path.suffix == ".md"
    row = {
        "op": "attention",
        "case": "gpt2-s b8",
        "mode": "fwd+bwd",
        "ms": {"triton": 2.0, "eager": 3.0, "compile": 1.0, "sdpa-cudnn": None},
        "peak_mib": {"triton": 10.0, "eager": 12.0},
        "max_abs_err": 1e-3,
    }
    assert bench.speedups(row) == {"eager": 1.5, "compile": 0.5}
    meta = dict(
        gpu="NVIDIA H100",
        date="2025-01-02T00:00:00+00:00",
        torch="2.x",
        triton="3.x",
        cuda="12.8",
        commit="uncommitted",
        dtype="bf16",
        command="python bench/kernels.py",
    )
    md = bench.render_markdown(meta, [row])
    assert "| attention | gpt2-s b8 | fwd+bwd | 2.000 | 3.000 | 1.000 | - | 1.500 | 0.500 | - |" in md
    assert "Triton beats every baseline (fwd+bwd) at: none" in md
    ln = {
        "op": "layer_norm",
        "case": "gpt2-s b8",
        "mode": "fwd+bwd",
        "params": {},
        "ms": {"triton": 2.0, "eager": 3.0, "compile": 1.0},
        "kernel_ms": {"triton": 1.0, "eager": 1.5, "compile": 1.1},
        "peak_mib": {"triton": 1.0, "eager": 2.0},
    }
    md = bench.render_markdown(meta, [ln])
    assert "| layer_norm | gpt2-s b8 | x eager | >= 1.2 | 1.50 ok | 1.50 ok |" in md
    assert "| layer_norm | gpt2-s b8 | x compile | >= 1 | 0.50 missed | 1.10 ok |" in md
    commit = bench.git_commit()  # bench/provenance.py's: HEAD, marked when the tree differs from it
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{40}(\+uncommitted changes)?", commit), commit


def test_bench_writes_the_dispatch_table_from_results(tmp_path):
    bench = _bench_module()
    meta = dict(
        gpu="Fake GPU X1",
        date="2026-01-02T00:00:00+00:00",
        torch="2.x",
        triton="3.x",
        cuda="13.0",
        commit="abc",
        dtype="bf16",
        command="python bench/kernels.py",
    )

    def row(op, case, params, triton, eager, compile_, graph=None):
        graph = graph or {"triton": triton, "eager": eager, "compile": compile_}
        return {
            "op": op,
            "case": case,
            "mode": "fwd+bwd",
            "params": params,
            "ms": {"triton": triton, "eager": eager, "compile": compile_},
            "kernel_ms": graph,
        }

    results = [
        row("layer_norm", "dim4096", {"rows": 8192, "dim": 4096}, 1.0, 2.0, 1.5),  # wins both ways
        row("layer_norm", "gpt2-s b8", {"rows": 8192, "dim": 768}, 1.0, 2.0, 0.99),  # loses to compile
        row(
            "bias_gelu",
            "vit-b b64",
            {"rows": 64, "dim": 3072},
            1.0,
            2.0,
            2.0,  # wins only with host
            graph={"triton": 1.0, "eager": 1.02, "compile": 2.0},
        ),  # overhead: within the margin
        row("cross_entropy", "gpt2-s b8", {"rows": 8192, "vocab": 50257}, 1.0, 3.0, 2.5),
        {**row("layer_norm", "dim4096", {"rows": 8192, "dim": 4096}, 9.0, 1.0, 1.0), "mode": "fwd"},
    ]
    results_file = tmp_path / "kernels-fake.json"
    results_file.write_text(json.dumps({"meta": meta, "results": results}))
    table = bench.write_table([results_file], tmp_path / "table.json")
    assert json.loads((tmp_path / "table.json").read_text()) == table
    chosen = {(e["op"], e["bucket"]): e["impl"] for e in table["entries"]}
    assert chosen == {
        ("layer_norm", "n4096"): "triton",
        ("layer_norm", "n1024"): "torch",
        ("bias_gelu", "n4096"): "torch",
        ("cross_entropy", "v65536"): "triton",
    }
    assert all(e["gpu"] == "Fake GPU X1" and e["dtype"] == "bf16" for e in table["entries"])
    assert table["sources"][0]["commit"] == "abc"
